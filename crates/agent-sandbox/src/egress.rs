//! The egress policy a backend keeps in force on its sandboxes (contracts X9, X10): which
//! destinations are allowed and denied beyond `allow_internet_access`, validated and put in
//! one canonical form, and its digest, which a created sandbox carries in its metadata and
//! this host's scope note records after a live update (E2B metadata cannot be changed).

use std::fmt;
use std::net::Ipv4Addr;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// The sandbox metadata key holding the digest of the policy a sandbox was created with.
pub const EGRESS_KEY: &str = "hermes.egress";

/// E2B's "every IPv4 destination": what `allow_internet_access = false` means.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The most entries one list may hold: E2B's own limits are account-specific; a longer list
/// is almost certainly a mistake, and every entry travels in each update request.
pub const MAX_EGRESS_ENTRIES: usize = 256;

/// Which of the two lists an entry belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EgressList {
    /// Destinations allowed even when a deny entry covers them (`allow_out`).
    Allow,
    /// Destinations refused (`deny_out`).
    Deny,
}

impl EgressList {
    /// The setting's and E2B's name: `allow_out` or `deny_out`.
    pub fn as_str(self) -> &'static str {
        match self {
            EgressList::Allow => "allow_out",
            EgressList::Deny => "deny_out",
        }
    }
}

/// Allowed and denied destinations. Allow beats deny (E2B's rule). Entries are IPv4
/// addresses, IPv4 CIDR blocks, and (allow only) domain names, matched by E2B on the HTTP
/// `Host` header (port 80) and the TLS server name (port 443), with `*.` for subdomains.
///
/// ```
/// use agent_sandbox::EgressPolicy;
///
/// let policy = EgressPolicy::new(
///     vec!["PyPI.org".into(), "10.0.0.0/8".into()],
///     vec!["0.0.0.0/0".into()],
/// ).unwrap();
/// assert_eq!(policy.allow_out(), ["10.0.0.0/8", "pypi.org"]);
/// assert!(EgressPolicy::new(vec![], vec!["example.com".into()]).is_err());
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow_out: Vec<String>,
    deny_out: Vec<String>,
}

impl fmt::Debug for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EgressPolicy")
            .field("allow_out", &self.allow_out)
            .field("deny_out", &self.deny_out)
            .finish()
    }
}

impl EgressPolicy {
    /// No rule: the sandbox's egress is what `allow_internet_access` says.
    pub fn none() -> EgressPolicy {
        EgressPolicy::default()
    }

    /// Validates both lists and puts them in canonical form (lower case, sorted, without
    /// duplicates, CIDR host bits cleared). The error names the list and the entry.
    pub fn new(allow_out: Vec<String>, deny_out: Vec<String>) -> Result<EgressPolicy, Error> {
        Ok(EgressPolicy {
            allow_out: canonical(EgressList::Allow, allow_out)?,
            deny_out: canonical(EgressList::Deny, deny_out)?,
        })
    }

    /// Rules as a sandbox reports them, unvalidated (for display: what E2B holds is shown
    /// even where this host would refuse an entry), sorted.
    pub fn reported(mut allow_out: Vec<String>, mut deny_out: Vec<String>) -> EgressPolicy {
        allow_out.sort();
        deny_out.sort();
        EgressPolicy {
            allow_out,
            deny_out,
        }
    }

    /// The allowed destinations, canonical.
    pub fn allow_out(&self) -> &[String] {
        &self.allow_out
    }

    /// The denied destinations, canonical.
    pub fn deny_out(&self) -> &[String] {
        &self.deny_out
    }

    /// Whether neither list has an entry.
    pub fn is_empty(&self) -> bool {
        self.allow_out.is_empty() && self.deny_out.is_empty()
    }

    /// The rules E2B must hold for this policy on a sandbox whose internet access is
    /// `internet`: with internet denied, `0.0.0.0/0` is in the deny list, as E2B itself
    /// records `allow_internet_access = false`, so a live update never opens what the
    /// posture closed.
    pub fn effective(&self, internet: sandbox_identity::InternetAccess) -> EgressPolicy {
        let mut effective = self.clone();
        if internet == sandbox_identity::InternetAccess::Denied
            && !effective.deny_out.iter().any(|entry| entry == ALL_TRAFFIC)
        {
            effective.deny_out.push(ALL_TRAFFIC.to_owned());
            effective.deny_out.sort();
        }
        effective
    }

    /// A short digest of the canonical lists (16 hex digits of SHA-256): equal policies have
    /// equal digests, whatever order or case they were written in.
    pub fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        for (tag, list) in [("allow", &self.allow_out), ("deny", &self.deny_out)] {
            hasher.update(tag.as_bytes());
            for entry in list {
                hasher.update([0]);
                hasher.update(entry.as_bytes());
            }
            hasher.update([1]);
        }
        hasher
            .finalize()
            .iter()
            .take(8)
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// One line for people: `allow pypi.org; deny 0.0.0.0/0`, or `no rules`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.allow_out.is_empty() {
            parts.push(format!("allow {}", self.allow_out.join(", ")));
        }
        if !self.deny_out.is_empty() {
            parts.push(format!("deny {}", self.deny_out.join(", ")));
        }
        if parts.is_empty() {
            "no rules".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// The SOCKS5 proxy every allowed TCP connection of the sandbox goes through (E2B's
/// `network.egressProxy`, X23): `host:port`, an RFC 1929 user name, and the variable whose
/// value (the profile's `.env`, through the credentials' resolver) is the password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressProxySetting {
    address: String,
    username: Option<String>,
    password_variable: Option<String>,
}

impl EgressProxySetting {
    /// Parses `socks5://[user@]host:port` (the password never in it: it comes from
    /// `password_variable`). The error says what is wrong, never the URL's secret part.
    pub fn parse(
        url: &str,
        password_variable: Option<String>,
    ) -> Result<EgressProxySetting, Error> {
        let invalid = |reason: &str| Error::InvalidConfig {
            reason: format!("egress_proxy {reason}"),
        };
        let rest = url
            .trim()
            .strip_prefix("socks5://")
            .ok_or_else(|| invalid("must be a socks5://host:port URL"))?;
        let rest = rest.trim_end_matches('/');
        let (username, address) = match rest.rsplit_once('@') {
            Some((user, address)) => {
                if user.contains(':') {
                    return Err(invalid(
                        "holds a password; put it in the profile's .env (E2B_EGRESS_PROXY_PASSWORD)",
                    ));
                }
                (Some(user.to_owned()).filter(|u| !u.is_empty()), address)
            }
            None => (None, rest),
        };
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| invalid("needs a port (socks5://host:port)"))?;
        let port_ok = port.parse::<u16>().is_ok_and(|port| port != 0);
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
        if !port_ok
            || !host_ok
            || username
                .as_deref()
                .is_some_and(|u| u.chars().any(char::is_control))
        {
            return Err(invalid(
                "must be socks5://[user@]host:port with a port from 1 to 65535",
            ));
        }
        Ok(EgressProxySetting {
            address: address.to_owned(),
            username,
            password_variable,
        })
    }

    /// `host:port`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The RFC 1929 user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The variable holding the password, if any.
    pub fn password_variable(&self) -> Option<&str> {
        self.password_variable.as_deref()
    }
}

/// What E2B must hold on a sandbox's network: the egress policy, the credentials' header
/// rules (X9, X16) and the egress proxy (X23), sent together since an update clears what it
/// omits.
#[derive(Clone, Debug)]
pub(crate) struct DesiredNetwork {
    /// Allowed and denied destinations, effective.
    pub(crate) policy: EgressPolicy,
    /// Per-host headers: placeholders of E2B Secrets, or the real values (X22).
    pub(crate) rules: e2b_client::TransformRules,
    /// The SOCKS5 proxy, its password resolved (X23).
    pub(crate) proxy: Option<e2b_client::EgressProxy>,
}

impl DesiredNetwork {
    /// The proxy `setting` means now, its password resolved through `values` (the
    /// credentials' resolver); a missing password is an error naming the variable.
    pub(crate) fn proxy(
        setting: Option<&EgressProxySetting>,
        values: &crate::credentials::Credentials,
    ) -> Result<Option<e2b_client::EgressProxy>, Error> {
        let Some(setting) = setting else {
            return Ok(None);
        };
        let password = match &setting.password_variable {
            None => None,
            Some(variable) => {
                Some(
                    values
                        .value_of(variable)
                        .ok_or_else(|| Error::MissingCredential {
                            name: variable.clone(),
                            source_file: values.source().to_owned(),
                            operation: "network rules",
                            sandbox_id: None,
                        })?,
                )
            }
        };
        Ok(Some(e2b_client::EgressProxy {
            address: setting.address.clone(),
            username: setting.username.clone(),
            password: password.map(e2b_client::SecretValue::new),
        }))
    }

    /// The policy's digest alone when there are no rules (so sandboxes stamped before
    /// credentials existed stay in force), else one digest of both.
    pub(crate) fn digest(&self) -> String {
        if self.rules.is_empty() && self.proxy.is_none() {
            return self.policy.digest();
        }
        let mut hasher = Sha256::new();
        hasher.update(self.policy.digest().as_bytes());
        hasher.update(b"+rules:");
        hasher.update(crate::credentials::rules_digest(&self.rules).as_bytes());
        if let Some(proxy) = &self.proxy {
            // The password enters only hashed, as header values do.
            hasher.update(b"+proxy:");
            hasher.update(proxy.address.as_bytes());
            hasher.update([0]);
            hasher.update(proxy.username.as_deref().unwrap_or("").as_bytes());
            hasher.update([0]);
            if let Some(password) = &proxy.password {
                hasher.update(Sha256::digest(password.expose().as_bytes()));
            }
        }
        hasher
            .finalize()
            .iter()
            .take(8)
            .map(|byte| format!("{byte:02x}"))
            .collect()
    }

    /// Whether a create request needs no `network` at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.policy.is_empty() && self.rules.is_empty() && self.proxy.is_none()
    }

    fn egress_rules(&self) -> e2b_client::EgressRules {
        e2b_client::EgressRules {
            allow_out: self.policy.allow_out().to_vec(),
            deny_out: self.policy.deny_out().to_vec(),
        }
    }

    /// The create request's `network`.
    pub(crate) fn network_config(&self) -> e2b_client::NetworkConfig {
        let mut config = e2b_client::NetworkConfig::new(self.egress_rules());
        config.rules = self.rules.clone();
        config.egress_proxy = self.proxy.clone();
        config
    }

    /// The whole update.
    pub(crate) fn update(&self) -> e2b_client::NetworkUpdate {
        let mut update = e2b_client::NetworkUpdate::new(self.egress_rules());
        update.rules = self.rules.clone();
        update.egress_proxy = self.proxy.clone();
        update
    }

    /// One line for people and logs, without any value: `allow pypi.org; credential
    /// headers for api.github.com`.
    pub(crate) fn summary(&self) -> String {
        let mut summary = self.policy.summary();
        if !self.rules.is_empty() {
            let hosts: Vec<&str> = self.rules.keys().map(String::as_str).collect();
            summary.push_str(&format!("; credential headers for {}", hosts.join(", ")));
        }
        if let Some(proxy) = &self.proxy {
            summary.push_str(&format!("; through the SOCKS5 proxy {}", proxy.address));
        }
        summary
    }
}

fn canonical(list: EgressList, entries: Vec<String>) -> Result<Vec<String>, Error> {
    if entries.len() > MAX_EGRESS_ENTRIES {
        return Err(Error::InvalidEgress {
            list: list.as_str(),
            entry: format!("{} entries", entries.len()),
            reason: format!("at most {MAX_EGRESS_ENTRIES} entries are accepted"),
        });
    }
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let canonical = destination(list, entry).map_err(|reason| Error::InvalidEgress {
            list: list.as_str(),
            entry: entry.to_owned(),
            reason,
        })?;
        out.push(canonical);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// One entry in canonical form, or why it is refused.
fn destination(list: EgressList, entry: &str) -> Result<String, String> {
    if let Some((address, prefix)) = entry.split_once('/') {
        let address: Ipv4Addr = address
            .parse()
            .map_err(|_| "is not an IPv4 CIDR block (such as 10.0.0.0/8)".to_owned())?;
        let prefix: u32 = prefix
            .parse()
            .ok()
            .filter(|prefix| *prefix <= 32)
            .ok_or_else(|| "has a prefix length that is not 0..32".to_owned())?;
        let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
        let network = Ipv4Addr::from(u32::from(address) & mask);
        // A /32 is the address itself: one spelling, one digest.
        return Ok(if prefix == 32 {
            network.to_string()
        } else {
            format!("{network}/{prefix}")
        });
    }
    if let Ok(address) = entry.parse::<Ipv4Addr>() {
        return Ok(address.to_string());
    }
    if entry.contains(':') {
        return Err("is an IPv6 address or has a port; E2B filters IPv4 destinations, by address or domain name".to_owned());
    }
    let name = entry.to_ascii_lowercase();
    let host = name.strip_prefix("*.").unwrap_or(&name);
    if !crate::credentials::is_dns_name(host) {
        return Err(
            "is neither an IPv4 address, an IPv4 CIDR block nor a domain name (such as pypi.org or *.github.com)"
                .to_owned(),
        );
    }
    if list == EgressList::Deny {
        return Err(format!(
            "is a domain name; E2B matches domain names only to allow them: deny {ALL_TRAFFIC} and allow {name} instead"
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Result<EgressPolicy, Error> {
        EgressPolicy::new(
            allow.iter().map(|s| (*s).to_owned()).collect(),
            deny.iter().map(|s| (*s).to_owned()).collect(),
        )
    }

    #[test]
    fn entries_are_canonical_and_equal_policies_share_a_digest() {
        let a = policy(
            &["PyPI.org", "10.1.2.3/8", "1.1.1.1", "pypi.org"],
            &["0.0.0.0/0"],
        )
        .unwrap();
        let b = policy(
            &["1.1.1.1/32", "10.0.0.0/8", "pypi.org"],
            &[" 0.0.0.0/0 ", ""],
        )
        .unwrap();
        assert_eq!(a.allow_out(), ["1.1.1.1", "10.0.0.0/8", "pypi.org"]);
        assert_eq!(a, b);
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.digest().len(), 16);
        // Moving an entry from one list to the other is another policy.
        let moved = policy(&["1.1.1.1"], &["10.0.0.0/8"]).unwrap();
        let kept = policy(&["1.1.1.1", "10.0.0.0/8"], &[]).unwrap();
        assert_ne!(moved.digest(), kept.digest());
        assert_ne!(EgressPolicy::none().digest(), kept.digest());
    }

    #[test]
    fn bad_entries_name_the_list_and_the_entry() {
        for (allow, deny, list, entry) in [
            (&["exa mple.com"][..], &[][..], "allow_out", "exa mple.com"),
            (&["10.0.0.0/33"], &[], "allow_out", "10.0.0.0/33"),
            (&["::1"], &[], "allow_out", "::1"),
            (&["localhost"], &[], "allow_out", "localhost"),
            (&["1.2.3"], &[], "allow_out", "1.2.3"),
            (&[], &["example.com"], "deny_out", "example.com"),
            (&[], &["*.example.com"], "deny_out", "*.example.com"),
        ] {
            let error = policy(allow, deny).unwrap_err();
            let text = error.to_string();
            assert!(error.is_invalid_egress(), "{text}");
            assert!(text.contains(list) && text.contains(entry), "{text}");
        }
        let wildcard = policy(&["*.GitHub.com"], &[]).unwrap();
        assert_eq!(wildcard.allow_out(), ["*.github.com"]);
    }

    #[test]
    fn denied_internet_keeps_all_traffic_denied() {
        let open = policy(&["1.1.1.1"], &[]).unwrap();
        let closed = open.effective(sandbox_identity::InternetAccess::Denied);
        assert_eq!(closed.deny_out(), [ALL_TRAFFIC]);
        assert_eq!(closed.allow_out(), ["1.1.1.1"]);
        assert_eq!(
            open.effective(sandbox_identity::InternetAccess::Allowed),
            open
        );
        assert_eq!(
            closed.effective(sandbox_identity::InternetAccess::Denied),
            closed
        );
    }
}
