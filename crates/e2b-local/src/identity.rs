//! Workload identity (a create's `iam`): named tokens a sandbox's outgoing requests carry
//! without the sandbox ever holding them. A header rule's value names one as
//! `${e2b.identity.tokens.<name>}`, and the egress proxy puts a freshly minted JWT-SVID in its
//! place at each request (see [`crate::egress`]), as E2B's does.
//!
//! The tokens are ES256 JWTs signed with the state directory's own key
//! (`<state_dir>/identity-key.p8`, owner-only, made on first start): `sub` is the sandbox's
//! SPIFFE id (`spiffe://e2b-local/sandbox/<id>`), `aud` the audience the create named, `iss`
//! the server's URL, valid for [`TOKEN_LIFETIME_SECS`]. A relying party verifies them
//! against the key set served at `/.well-known/jwks.json` (also named by
//! `/.well-known/openid-configuration`), so a local stand-in for a cloud's STS can be tested
//! offline.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::clock::Clock;
use crate::reply::ApiError;

const KEY_FILE: &str = "identity-key.p8";

/// E2B's limit on the tokens one sandbox names.
const MAX_TOKENS: usize = 5;

/// The only token type E2B accepts.
pub(crate) const JWT_SVID: &str = "JWT-SVID";

/// How long a minted token is valid.
pub(crate) const TOKEN_LIFETIME_SECS: u64 = 300;

/// What opens an identity placeholder; `}` closes it.
pub(crate) const PLACEHOLDER_START: &str = "${e2b.identity.tokens.";

/// One token a create's `iam.tokens` names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IamToken {
    pub(crate) audience: String,
    #[serde(rename = "tokenType")]
    pub(crate) token_type: String,
}

/// A create's `iam`.
#[derive(Debug, Deserialize)]
pub(crate) struct IamBody {
    #[serde(default)]
    tokens: Option<BTreeMap<String, IamToken>>,
}

/// Checks a create's `iam` as E2B does; an absent or empty token map is none.
pub(crate) fn check(iam: Option<IamBody>) -> Result<BTreeMap<String, IamToken>, ApiError> {
    let tokens = iam.and_then(|iam| iam.tokens).unwrap_or_default();
    if tokens.len() > MAX_TOKENS {
        return Err(ApiError::bad_request(format!(
            "iam.tokens: too many tokens: {} (max {MAX_TOKENS})",
            tokens.len()
        )));
    }
    for (name, token) in &tokens {
        if name.is_empty() || name.chars().any(|c| c == '{' || c == '}' || c.is_control()) {
            return Err(ApiError::bad_request(
                "iam.tokens: a token name is not empty and has no '{', '}' or control characters",
            ));
        }
        if token.audience.is_empty() {
            return Err(ApiError::bad_request(format!(
                "iam.tokens.{name}.audience: audience is required"
            )));
        }
        if token.token_type != JWT_SVID {
            return Err(ApiError::bad_request(format!(
                "iam.tokens.{name}.tokenType: only \"{JWT_SVID}\" is supported"
            )));
        }
    }
    Ok(tokens)
}

/// The sandbox a request leaves from, and the tokens it may carry.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub(crate) sandbox_id: String,
    pub(crate) tokens: BTreeMap<String, IamToken>,
}

/// What a header rule's value may name by placeholder: the team's secrets
/// (`${e2b.secrets.<name>}`) and the sandbox's workload tokens
/// (`${e2b.identity.tokens.<name>}`), resolved at each request.
#[derive(Debug)]
pub(crate) struct Placeholders {
    pub(crate) secrets: std::sync::Arc<crate::secrets::Secrets>,
    pub(crate) identity: std::sync::Arc<Issuer>,
}

impl Placeholders {
    /// `text` with its placeholders resolved in one pass from left to right: a secret's
    /// value and a minted token are put in, never read for placeholders. The error names
    /// what is missing, never a value.
    pub(crate) fn resolve(
        &self,
        workload: Option<&Workload>,
        text: &str,
    ) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find(PLACEHOLDER_START) {
            out.push_str(&self.secrets.resolve(&rest[..at])?);
            let after = &rest[at + PLACEHOLDER_START.len()..];
            let Some(end) = after.find('}') else {
                return Err("an identity placeholder is not closed with '}'".to_owned());
            };
            out.push_str(&self.identity.mint(workload, &after[..end])?);
            rest = &after[end + 1..];
        }
        out.push_str(&self.secrets.resolve(rest)?);
        Ok(out)
    }
}

/// The signing key, and the issuer its tokens name.
pub(crate) struct Issuer {
    key: EcdsaKeyPair,
    kid: String,
    clock: Clock,
    rng: SystemRandom,
    /// The server's URL, known once it listens.
    url: OnceLock<String>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Loads the state directory's key, or makes one (owner-only).
    pub(crate) fn open(state_dir: &Path, clock: Clock) -> io::Result<Issuer> {
        let path = state_dir.join(KEY_FILE);
        let rng = SystemRandom::new();
        let pkcs8 = match fs::read(&path) {
            Ok(bytes) => {
                fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
                bytes
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let made = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                    .map_err(|_| io::Error::other("generating the identity key failed"))?;
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                file.write_all(made.as_ref())?;
                file.sync_all()?;
                made.as_ref().to_vec()
            }
            Err(error) => return Err(error),
        };
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng)
            .map_err(|_| io::Error::other(format!("{} is not a P-256 key", path.display())))?;
        let digest = sha2::Sha256::digest(key.public_key().as_ref());
        let kid = URL_SAFE_NO_PAD.encode(&digest[..12]);
        Ok(Issuer {
            key,
            kid,
            clock,
            rng,
            url: OnceLock::new(),
        })
    }

    /// Names the issuer (the server's URL), once it listens.
    pub(crate) fn set_url(&self, url: String) {
        let _ = self.url.set(url);
    }

    fn issuer(&self) -> &str {
        self.url.get().map_or("e2b-local", String::as_str)
    }

    /// A JWT-SVID for `workload`'s token `name`.
    pub(crate) fn mint(&self, workload: Option<&Workload>, name: &str) -> Result<String, String> {
        let Some(workload) = workload else {
            return Err("the sandbox was created without iam tokens".to_owned());
        };
        let token = workload.tokens.get(name).ok_or_else(|| {
            format!(
                "the sandbox has no workload token '{}' (its create's iam.tokens names {:?})",
                name.chars().filter(|c| !c.is_control()).collect::<String>(),
                workload.tokens.keys().collect::<Vec<_>>()
            )
        })?;
        let now = self
            .clock
            .now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let claims = json!({
            "iss": self.issuer(),
            "sub": format!("spiffe://e2b-local/sandbox/{}", workload.sandbox_id),
            "aud": [token.audience],
            "iat": now,
            "nbf": now,
            "exp": now + TOKEN_LIFETIME_SECS,
            "jti": URL_SAFE_NO_PAD.encode(rand::random::<[u8; 12]>()),
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| "signing the workload token failed".to_owned())?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        ))
    }

    /// The key set relying parties verify tokens with (`/.well-known/jwks.json`).
    pub(crate) fn jwks(&self) -> Value {
        let point = self.key.public_key().as_ref();
        // An uncompressed P-256 point: 0x04, then x and y of 32 bytes each.
        let (x, y) = point[1..].split_at(32);
        json!({"keys": [{
            "kty": "EC",
            "crv": "P-256",
            "alg": "ES256",
            "use": "sig",
            "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(x),
            "y": URL_SAFE_NO_PAD.encode(y),
        }]})
    }

    /// The discovery document (`/.well-known/openid-configuration`).
    pub(crate) fn discovery(&self) -> Value {
        json!({
            "issuer": self.issuer(),
            "jwks_uri": format!("{}/.well-known/jwks.json", self.issuer()),
            "id_token_signing_alg_values_supported": ["ES256"],
            "subject_types_supported": ["public"],
            "response_types_supported": ["id_token"],
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ring::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    use super::*;

    fn workload() -> Workload {
        Workload {
            sandbox_id: "isb123".into(),
            tokens: BTreeMap::from([(
                "aws".to_owned(),
                IamToken {
                    audience: "sts.amazonaws.com".into(),
                    token_type: JWT_SVID.into(),
                },
            )]),
        }
    }

    #[test]
    fn a_minted_token_verifies_against_the_published_key_and_names_its_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::manual(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000));
        let issuer = std::sync::Arc::new(Issuer::open(dir.path(), clock.clone()).unwrap());
        issuer.set_url("http://127.0.0.1:9".into());
        let placeholders = Placeholders {
            secrets: std::sync::Arc::new(crate::secrets::Secrets::open(dir.path(), clock).unwrap()),
            identity: std::sync::Arc::clone(&issuer),
        };
        let header = placeholders
            .resolve(Some(&workload()), "Bearer ${e2b.identity.tokens.aws}")
            .unwrap();
        let token = header.strip_prefix("Bearer ").unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let jwks = issuer.jwks();
        let key = &jwks["keys"][0];
        let mut point = vec![4u8];
        point.extend(URL_SAFE_NO_PAD.decode(key["x"].as_str().unwrap()).unwrap());
        point.extend(URL_SAFE_NO_PAD.decode(key["y"].as_str().unwrap()).unwrap());
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &point)
            .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
            .expect("signed by the published key");
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["sub"], "spiffe://e2b-local/sandbox/isb123");
        assert_eq!(claims["aud"], json!(["sts.amazonaws.com"]));
        assert_eq!(claims["iss"], "http://127.0.0.1:9");
        assert_eq!(claims["exp"], 1_000_000 + TOKEN_LIFETIME_SECS);
        // The key survives a restart: tokens minted before it still verify.
        let again = Issuer::open(dir.path(), Clock::manual(SystemTime::UNIX_EPOCH)).unwrap();
        assert_eq!(again.jwks(), jwks);
    }

    #[test]
    fn unknown_tokens_and_bad_definitions_are_refused_naming_why() {
        let dir = tempfile::tempdir().unwrap();
        let placeholders = Placeholders {
            secrets: std::sync::Arc::new(
                crate::secrets::Secrets::open(dir.path(), Clock::system()).unwrap(),
            ),
            identity: std::sync::Arc::new(Issuer::open(dir.path(), Clock::system()).unwrap()),
        };
        let err = placeholders
            .resolve(Some(&workload()), "${e2b.identity.tokens.gcp}")
            .unwrap_err();
        assert!(err.contains("'gcp'"), "{err}");
        let err = placeholders
            .resolve(None, "${e2b.identity.tokens.aws}")
            .unwrap_err();
        assert!(err.contains("without iam"), "{err}");
        assert_eq!(placeholders.resolve(None, "plain").unwrap(), "plain");
        // A secret's placeholder cannot be spliced across a token's.
        assert!(
            placeholders
                .resolve(
                    Some(&workload()),
                    "${e2b.secrets.${e2b.identity.tokens.aws}}"
                )
                .is_err()
        );
        let body =
            |tokens: Value| serde_json::from_value::<IamBody>(json!({"tokens": tokens})).unwrap();
        let err = check(Some(body(
            json!({"a": {"audience": "x", "tokenType": "OIDC"}}),
        )))
        .unwrap_err();
        assert!(err.message.contains("JWT-SVID"), "{}", err.message);
        let err = check(Some(body(
            json!({"a}b": {"audience": "x", "tokenType": "JWT-SVID"}}),
        )))
        .unwrap_err();
        assert!(err.message.contains("'}'"), "{}", err.message);
        let err = check(Some(body(
            json!({"a": {"audience": "", "tokenType": "JWT-SVID"}}),
        )))
        .unwrap_err();
        assert!(err.message.contains("audience"), "{}", err.message);
        assert!(check(None).unwrap().is_empty());
    }
}
