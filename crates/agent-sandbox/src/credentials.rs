//! Credentials the sandbox never holds (contract X16): each configured variable reaches the
//! sandbox's commands as a random stand-in, while the sandbox's E2B network rules make E2B's
//! egress proxy set the real header (`Authorization: Bearer <value>`) on requests to the
//! variable's hosts. The real value is resolved on the host, through the binding's resolver
//! (a Hermes profile's `.env`), at every command, never from configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use e2b_client::{HeaderTransform, SecretValue, TransformRules};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// The header a credential sets when none is configured.
pub const DEFAULT_CREDENTIAL_HEADER: &str = "Authorization";

/// How a credential's value becomes the header value when no format is configured.
pub const DEFAULT_CREDENTIAL_FORMAT: &str = "Bearer {value}";

/// The placeholder a format must hold once.
pub const VALUE_PLACEHOLDER: &str = "{value}";

/// E2B's limit on the domains of one sandbox's rules.
pub const MAX_CREDENTIAL_HOSTS: usize = 10;

/// The longest variable name: its E2B secret's name (prefix, profile, name) must stay
/// within E2B's 128 characters.
pub const MAX_VARIABLE_NAME: usize = 100;

/// E2B's limit on the headers one rule sets.
pub const MAX_HEADERS_PER_HOST: usize = 20;

/// E2B's limit on a header name's length.
pub const MAX_HEADER_NAME: usize = 64;

/// E2B's limit on a header value's length.
pub const MAX_HEADER_VALUE: usize = 2048;

/// One variable whose value E2B's egress adds as a header for its hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    name: String,
    hosts: Vec<String>,
    header: String,
    format: String,
    /// More headers the value sets on the same hosts (name, format), as Hermes' egress
    /// mappings list several (`match_headers`).
    more_headers: Vec<(String, String)>,
    /// Other variable names the sandbox sees the same stand-in under (Hermes'
    /// `alias_env_names`).
    aliases: Vec<String>,
}

impl Credential {
    /// Validates and canonicalises one credential: `name` an environment variable name,
    /// `hosts` plain DNS names (no wildcard, no address; lower-cased, sorted), `header` an
    /// HTTP header name (default [`DEFAULT_CREDENTIAL_HEADER`]), `format` holding
    /// [`VALUE_PLACEHOLDER`] once (default [`DEFAULT_CREDENTIAL_FORMAT`]). The error names
    /// the variable.
    pub fn new(
        name: String,
        hosts: Vec<String>,
        header: Option<String>,
        format: Option<String>,
    ) -> Result<Credential, Error> {
        let invalid = |reason: String| Error::InvalidCredential {
            name: name.clone(),
            reason,
        };
        let name_ok = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok || name.len() > MAX_VARIABLE_NAME {
            return Err(invalid(format!(
                "is not an environment variable name of at most {MAX_VARIABLE_NAME} letters, digits and _"
            )));
        }
        let mut canonical = Vec::with_capacity(hosts.len());
        for host in hosts {
            let host = host.trim().to_ascii_lowercase();
            if !is_dns_name(&host) {
                return Err(invalid(format!(
                    "host {host:?} is not a plain DNS name (such as api.github.com; no wildcard, address or port)"
                )));
            }
            canonical.push(host);
        }
        canonical.sort();
        canonical.dedup();
        if canonical.is_empty() {
            return Err(invalid("lists no hosts".to_owned()));
        }
        let header = header.unwrap_or_else(|| DEFAULT_CREDENTIAL_HEADER.to_owned());
        if header.is_empty()
            || header.len() > MAX_HEADER_NAME
            || !header
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(invalid(format!(
                "header {header:?} is not a header name of at most {MAX_HEADER_NAME} letters, digits, - and _"
            )));
        }
        let format = format.unwrap_or_else(|| DEFAULT_CREDENTIAL_FORMAT.to_owned());
        if format.matches(VALUE_PLACEHOLDER).count() != 1 || format.chars().any(char::is_control) {
            return Err(invalid(format!(
                "format must hold {VALUE_PLACEHOLDER} exactly once and no control characters"
            )));
        }
        Ok(Credential {
            name,
            hosts: canonical,
            header,
            format,
            more_headers: Vec::new(),
            aliases: Vec::new(),
        })
    }

    /// The same credential setting `header` too, with `format` (checked as [`Credential::new`]
    /// checks its own); a header it sets already is left as it is.
    pub fn with_header(mut self, header: String, format: String) -> Result<Credential, Error> {
        let checked = Credential::new(
            self.name.clone(),
            self.hosts.clone(),
            Some(header),
            Some(format),
        )?;
        let taken = std::iter::once(&self.header)
            .chain(self.more_headers.iter().map(|(name, _)| name))
            .any(|name| name.eq_ignore_ascii_case(&checked.header));
        if !taken {
            self.more_headers.push((checked.header, checked.format));
        }
        Ok(self)
    }

    /// The same credential, its stand-in also under `aliases` (environment variable names).
    pub fn with_aliases(mut self, aliases: Vec<String>) -> Result<Credential, Error> {
        for alias in aliases {
            let checked = Credential::new(alias, self.hosts.clone(), None, None)?;
            if checked.name != self.name && !self.aliases.contains(&checked.name) {
                self.aliases.push(checked.name);
            }
        }
        self.aliases.sort();
        Ok(self)
    }

    /// Every header it sets and its format: the first, then the others.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> {
        std::iter::once((self.header.as_str(), self.format.as_str())).chain(
            self.more_headers
                .iter()
                .map(|(name, format)| (name.as_str(), format.as_str())),
        )
    }

    /// The other names its stand-in goes under.
    pub fn aliases(&self) -> &[String] {
        &self.aliases
    }

    /// The variable name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hosts whose requests get the header, canonical.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The header name.
    pub fn header(&self) -> &str {
        &self.header
    }

    /// The header value's format.
    pub fn format(&self) -> &str {
        &self.format
    }
}

/// Whether `host` is a DNS name E2B takes in egress and header rules: two labels or more
/// (letters, digits and inner hyphens, at most 63 each, 253 in all), not all digits.
pub(crate) fn is_dns_name(host: &str) -> bool {
    host.len() <= 253
        && host.contains('.')
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !host
            .split('.')
            .all(|label| label.chars().all(|c| c.is_ascii_digit()))
}

/// Resolves a credential's real value by variable name, on the host (Hermes: the profile's
/// `.env` and environment). `None`: no value.
pub type CredentialValues = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// The configured credentials and where their values come from.
#[derive(Clone)]
pub struct Credentials {
    list: Vec<Credential>,
    values: CredentialValues,
    source: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("list", &self.list)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Credentials) -> bool {
        self.list == other.list && self.source == other.source
    }
}

impl Credentials {
    /// No credential.
    pub fn none() -> Credentials {
        Credentials {
            list: Vec::new(),
            values: Arc::new(|_| None),
            source: String::new(),
        }
    }

    /// `list`, whose values `values` resolves; `source` names where a value belongs (the
    /// profile's `.env`), for the error about a missing one. Refused (naming a variable):
    /// two credentials of one name, two setting the same header on one host, and more hosts
    /// or headers than E2B takes.
    pub fn new(
        mut list: Vec<Credential>,
        values: CredentialValues,
        source: String,
    ) -> Result<Credentials, Error> {
        list.sort_by(|a, b| a.name.cmp(&b.name));
        let mut seen = std::collections::BTreeSet::new();
        for credential in &list {
            for alias in &credential.aliases {
                if list.iter().any(|other| other.name == *alias) {
                    return Err(Error::InvalidCredential {
                        name: credential.name.clone(),
                        reason: format!(
                            "names {alias} as an alias, which is a credential of its own"
                        ),
                    });
                }
            }
            // E2B's secret names are case-insensitive: one secret per name, whatever its case.
            if !seen.insert(credential.name.to_ascii_lowercase()) {
                return Err(Error::InvalidCredential {
                    name: credential.name.clone(),
                    reason: "is configured twice (names are compared without case)".to_owned(),
                });
            }
        }
        let mut per_host: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for credential in &list {
            for (host, (header, _)) in credential
                .hosts
                .iter()
                .flat_map(|host| credential.headers().map(move |header| (host, header)))
            {
                let headers = per_host.entry(host).or_default();
                if headers.iter().any(|h| h.eq_ignore_ascii_case(header)) {
                    return Err(Error::InvalidCredential {
                        name: credential.name.clone(),
                        reason: format!(
                            "sets header {header} on {host}, which another credential sets too"
                        ),
                    });
                }
                headers.push(header);
                if headers.len() > MAX_HEADERS_PER_HOST {
                    return Err(Error::InvalidCredential {
                        name: credential.name.clone(),
                        reason: format!(
                            "makes more than {MAX_HEADERS_PER_HOST} headers for {host}, E2B's limit"
                        ),
                    });
                }
            }
        }
        if per_host.len() > MAX_CREDENTIAL_HOSTS {
            let name = list.last().map(|c| c.name.clone()).unwrap_or_default();
            return Err(Error::InvalidCredential {
                name,
                reason: format!(
                    "the credentials name {} hosts; E2B takes at most {MAX_CREDENTIAL_HOSTS}",
                    per_host.len()
                ),
            });
        }
        Ok(Credentials {
            list,
            values,
            source,
        })
    }

    /// The same values and source with another list (a re-read setting), checked as
    /// [`Credentials::new`] checks.
    pub fn with_list(&self, list: Vec<Credential>) -> Result<Credentials, Error> {
        Credentials::new(list, Arc::clone(&self.values), self.source.clone())
    }

    /// The credentials, sorted by name.
    pub fn list(&self) -> &[Credential] {
        &self.list
    }

    /// Whether none is configured.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Where the values belong (for messages).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `name`'s value now, through the same resolver (the egress proxy's password, X23).
    pub(crate) fn value_of(&self, name: &str) -> Option<String> {
        (self.values)(name).filter(|value| !value.is_empty())
    }

    /// Whether `name`'s value resolves now, or one of its aliases' (for a listing; the
    /// value is not kept).
    pub fn has_value(&self, name: &str) -> bool {
        match self.list.iter().find(|credential| credential.name == name) {
            Some(credential) => self.value_for(credential).is_some(),
            None => self.value_of(name).is_some(),
        }
    }

    /// A credential's value: its own name's, else the first alias's that has one (as
    /// Hermes' firewall reads `GOOGLE_API_KEY` for `GEMINI_API_KEY`).
    fn value_for(&self, credential: &Credential) -> Option<String> {
        std::iter::once(&credential.name)
            .chain(&credential.aliases)
            .find_map(|name| self.value_of(name))
    }

    /// Every credential's value, resolved now, with the secret that holds it in `store`. A
    /// missing value is an error naming the variable and the source, never the value.
    pub(crate) fn resolve(
        &self,
        store: &crate::secret_store::ProfileStore,
    ) -> Result<Vec<crate::secret_store::Resolved>, Error> {
        self.list
            .iter()
            .map(|credential| {
                let value = self
                    .value_for(credential)
                    .ok_or_else(|| Error::MissingCredential {
                        name: credential.name.clone(),
                        source_file: self.source.clone(),
                        operation: "network rules",
                        sandbox_id: None,
                    })?;
                Ok(crate::secret_store::Resolved {
                    variable: credential.name.clone(),
                    secret: store.secret_name(&credential.name),
                    value: SecretValue::new(value),
                })
            })
            .collect()
    }

    /// The rules E2B must hold for `resolved` (this list's values, in order): for each host,
    /// the headers, holding the secret's placeholder when `in_force` is E2B Secrets (X22),
    /// else the value itself. A header E2B would refuse is an error naming the variable.
    pub(crate) fn rules_for(
        &self,
        resolved: &[crate::secret_store::Resolved],
        in_force: &crate::secret_store::StoreInForce,
    ) -> Result<TransformRules, Error> {
        let mut per_host: BTreeMap<String, BTreeMap<String, SecretValue>> = BTreeMap::new();
        for (credential, resolved) in self.list.iter().zip(resolved) {
            let value = match in_force {
                crate::secret_store::StoreInForce::Secrets => {
                    e2b_client::secret_placeholder(&resolved.secret).map_err(|reason| {
                        Error::InvalidCredential {
                            name: credential.name.clone(),
                            reason,
                        }
                    })?
                }
                crate::secret_store::StoreInForce::Rules { .. } => {
                    resolved.value.expose().to_owned()
                }
            };
            for (name, format) in credential.headers() {
                let header = format.replace(VALUE_PLACEHOLDER, &value);
                let real_length = format
                    .replace(VALUE_PLACEHOLDER, resolved.value.expose())
                    .len();
                if header.len().max(real_length) > MAX_HEADER_VALUE
                    || header.chars().any(char::is_control)
                    || resolved.value.expose().chars().any(char::is_control)
                {
                    return Err(Error::InvalidCredential {
                        name: credential.name.clone(),
                        reason: format!(
                            "its header value is longer than {MAX_HEADER_VALUE} bytes or holds control characters"
                        ),
                    });
                }
                for host in &credential.hosts {
                    per_host
                        .entry(host.clone())
                        .or_default()
                        .insert(name.to_owned(), SecretValue::new(header.clone()));
                }
            }
        }
        Ok(per_host
            .into_iter()
            .map(|(host, headers)| (host, vec![HeaderTransform { headers }]))
            .collect())
    }

    /// The rules with the values themselves (the `rules` store), for tests.
    #[cfg(test)]
    pub(crate) fn rules(&self) -> Result<TransformRules, Error> {
        let store = crate::secret_store::profile_store("test:", std::path::Path::new("/p"), None);
        let resolved = self.resolve(&store)?;
        self.rules_for(
            &resolved,
            &crate::secret_store::StoreInForce::Rules { why: String::new() },
        )
    }
}

/// The rules `credentials` need now for `operation` on `sandbox` (None before a create),
/// their values put in `store` first when E2B Secrets are in force (X22). `client` is asked
/// only when a request must be sent.
pub(crate) fn credential_rules(
    store: &crate::secret_store::ProfileStore,
    choice: crate::secret_store::CredentialStore,
    credentials: &Credentials,
    runtime: &tokio::runtime::Handle,
    client: impl FnOnce() -> Result<e2b_client::Client, Error>,
    operation: &'static str,
    sandbox: Option<&str>,
) -> Result<e2b_client::TransformRules, Error> {
    if credentials.is_empty() {
        return Ok(e2b_client::TransformRules::new());
    }
    let resolved = credentials
        .resolve(store)
        .map_err(|error| error.needed_by(operation, sandbox))?;
    let in_force = match store.settled_for(choice, &resolved) {
        Some(in_force) => in_force,
        None => {
            let client = client()?;
            runtime
                .block_on(store.sync(&client, choice, &resolved))
                .map_err(|error| error.needed_by(operation, sandbox))?
        }
    };
    credentials.rules_for(&resolved, &in_force)
}

/// A digest of transform rules (hosts, header names and a hash of each value): equal rules,
/// equal digests; a changed value, another digest. 16 hex digits.
pub(crate) fn rules_digest(rules: &TransformRules) -> String {
    let mut hasher = Sha256::new();
    for (host, list) in rules {
        hasher.update(host.as_bytes());
        hasher.update([0]);
        for rule in list {
            for (name, value) in &rule.headers {
                hasher.update(name.to_ascii_lowercase().as_bytes());
                hasher.update([0]);
                hasher.update(Sha256::digest(value.expose().as_bytes()));
            }
            hasher.update([1]);
        }
        hasher.update([2]);
    }
    hex(&hasher.finalize()[..8])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> CredentialValues {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Arc::new(move |name| map.get(name).cloned())
    }

    fn github() -> Credential {
        Credential::new(
            "GITHUB_TOKEN".to_owned(),
            vec!["API.GitHub.com".to_owned()],
            None,
            None,
        )
        .unwrap()
    }

    #[test]
    fn defaults_and_rules_carry_the_formatted_value_per_host() {
        // contract: X16
        let example = Credential::new(
            "EXAMPLE_KEY".to_owned(),
            vec!["api.example.test".to_owned(), "api.github.com".to_owned()],
            Some("x-api-key".to_owned()),
            Some("{value}".to_owned()),
        )
        .unwrap();
        assert_eq!(github().hosts(), ["api.github.com"]);
        assert_eq!(github().header(), "Authorization");
        let credentials = Credentials::new(
            vec![github(), example],
            values(&[("GITHUB_TOKEN", "ghp_real1234"), ("EXAMPLE_KEY", "ex-real")]),
            "/p/.env".to_owned(),
        )
        .unwrap();
        let rules = credentials.rules().unwrap();
        let github_headers = &rules["api.github.com"][0].headers;
        assert_eq!(
            github_headers["Authorization"].expose(),
            "Bearer ghp_real1234"
        );
        assert_eq!(github_headers["x-api-key"].expose(), "ex-real");
        assert_eq!(
            rules["api.example.test"][0].headers["x-api-key"].expose(),
            "ex-real"
        );
        // A changed value is another digest; the same value the same.
        let changed = Credentials::new(
            vec![github()],
            values(&[("GITHUB_TOKEN", "ghp_other")]),
            String::new(),
        )
        .unwrap();
        let same = Credentials::new(
            vec![github()],
            values(&[("GITHUB_TOKEN", "ghp_real1234")]),
            String::new(),
        )
        .unwrap();
        assert_ne!(
            rules_digest(&changed.rules().unwrap()),
            rules_digest(&same.rules().unwrap())
        );
        assert_eq!(
            rules_digest(&same.rules().unwrap()),
            rules_digest(&same.rules().unwrap())
        );
        // Debug never shows a value.
        let shown = format!("{rules:?} {credentials:?}");
        assert!(
            !shown.contains("ghp_real1234") && !shown.contains("ex-real"),
            "{shown}"
        );
    }

    #[test]
    fn a_missing_value_names_the_variable_and_the_file() {
        // contract: X16
        let credentials =
            Credentials::new(vec![github()], values(&[]), "/p/.env".to_owned()).unwrap();
        let text = credentials.rules().unwrap_err().to_string();
        assert!(
            text.contains("GITHUB_TOKEN") && text.contains("/p/.env"),
            "{text}"
        );
        assert!(!credentials.has_value("GITHUB_TOKEN"));
        // What needed the value, and for which sandbox, once the backend says so.
        let error = credentials.rules().unwrap_err();
        assert_eq!(
            error.needed_by("command", Some("i1")).to_string(),
            "E2B command refused for sandbox i1: credential GITHUB_TOKEN has no value: set GITHUB_TOKEN in /p/.env"
        );
        let error = credentials.rules().unwrap_err();
        assert_eq!(
            error.needed_by("create", None).to_string(),
            "E2B create refused: credential GITHUB_TOKEN has no value: set GITHUB_TOKEN in /p/.env"
        );
    }

    #[test]
    fn bad_settings_are_refused_naming_the_variable() {
        for (name, hosts, header, format) in [
            ("1BAD", vec!["a.example"], None, None),
            ("OK", vec!["*.example.com"], None, None),
            ("OK", vec!["10.0.0.1"], None, None),
            ("OK", vec!["a.example:443"], None, None),
            ("OK", vec![], None, None),
            ("OK", vec!["a.example"], Some("bad header"), None),
            ("OK", vec!["a.example"], None, Some("no placeholder")),
        ] {
            let error = Credential::new(
                name.to_owned(),
                hosts.into_iter().map(str::to_owned).collect(),
                header.map(str::to_owned),
                format.map(str::to_owned),
            )
            .unwrap_err();
            assert!(error.to_string().contains(name), "{error}");
        }
        let twice = Credentials::new(vec![github(), github()], values(&[]), String::new());
        assert!(twice.unwrap_err().to_string().contains("GITHUB_TOKEN"));
        let many: Vec<Credential> = (0..11)
            .map(|i| {
                Credential::new(format!("K{i}"), vec![format!("h{i}.example")], None, None).unwrap()
            })
            .collect();
        assert!(Credentials::new(many, values(&[]), String::new()).is_err());
    }
}
