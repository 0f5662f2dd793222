//! Secret strings whose `Debug` and `Display` never show the value.

use std::fmt;

/// Defines a secret newtype: the value is reachable only through `expose`.
macro_rules! secret_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            /// Wraps a secret value.
            pub fn new(value: String) -> $name {
                $name(value)
            }

            /// The secret itself, for the one place that must send it.
            pub fn expose(&self) -> &str {
                &self.0
            }

            /// Whether the secret is the empty string.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "([REDACTED])"))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("[REDACTED]")
            }
        }
    };
}

secret_type!(
    /// The E2B API key, sent only in the `X-API-Key` header of control-plane requests.
    ///
    /// `Debug` and `Display` print `[REDACTED]`; use [`ApiKey::expose`] to read it.
    ApiKey
);

secret_type!(
    /// A sandbox's envd access token, sent only in the `X-Access-Token` header.
    ///
    /// `Debug` and `Display` print `[REDACTED]`; use [`AccessToken::expose`] to read it.
    AccessToken
);

secret_type!(
    /// A secret the control plane carries for a sandbox: a header value E2B's egress proxy
    /// sets on requests to a domain (`network.rules`), or the egress proxy's password.
    ///
    /// `Debug` and `Display` print `[REDACTED]`; use [`SecretValue::expose`] to read it.
    SecretValue
);

impl ApiKey {
    /// Reads `E2B_API_KEY` from the process environment; unset or empty gives `None`.
    pub fn from_env() -> Option<ApiKey> {
        std::env::var("E2B_API_KEY")
            .ok()
            .filter(|value| !value.is_empty())
            .map(ApiKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_hide_the_value() {
        // contract: X1
        let key = ApiKey::new("e2b_0123456789abcdef".to_owned());
        let token = AccessToken::new("tok-secret-value".to_owned());
        let header = SecretValue::new("Bearer ghp_secret-value".to_owned());
        for shown in [
            format!("{header:?}"),
            format!("{header}"),
            format!("{key:?}"),
            format!("{key}"),
            format!("{token:?}"),
            format!("{token}"),
            format!("{:?}", Some(&key)),
        ] {
            assert!(!shown.contains("0123456789"), "{shown}");
            assert!(!shown.contains("secret-value"), "{shown}");
            assert!(shown.contains("[REDACTED]"), "{shown}");
        }
        assert_eq!(key.expose(), "e2b_0123456789abcdef");
    }
}
