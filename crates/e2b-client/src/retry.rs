//! Retry decisions: pure functions of the policy, the request kind and what happened.

use std::time::Duration;

use http::HeaderMap;

use crate::config::RetryPolicy;
use crate::error::is_transient_status;

/// Whether sending a request twice is harmless.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idempotency {
    /// Reads, kills, uploads that overwrite: any transient failure may be retried.
    Idempotent,
    /// Create, Start, Move: retried only when the request certainly never left (connect
    /// failure), so the server never sees it twice.
    NotIdempotent,
}

/// What one attempt produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// No connection: the request was not sent.
    ConnectFailed,
    /// The connection broke after the request may have been sent.
    ConnectionLost,
    /// An error response.
    Status {
        /// HTTP status.
        status: u16,
        /// `Should-Retry`, when present and valid.
        should_retry: Option<bool>,
        /// `Retry-After` in seconds, when present and valid.
        retry_after: Option<Duration>,
        /// The response says the sandbox is gone; retrying cannot help.
        sandbox_gone: bool,
    },
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Wait this long, then try again.
    RetryAfter(Duration),
    /// Report the failure.
    GiveUp,
}

/// Decides whether retry number `retries_done + 1` happens, and after what wait.
/// `jitter` is a fraction in `[0, 1]`.
pub(crate) fn decide(
    policy: &RetryPolicy,
    idempotency: Idempotency,
    retries_done: u32,
    outcome: Outcome,
    jitter: f64,
) -> Decision {
    if retries_done >= policy.max_retries {
        return Decision::GiveUp;
    }
    let backoff = backoff(policy, retries_done, jitter);
    match (outcome, idempotency) {
        (Outcome::ConnectFailed, _) => Decision::RetryAfter(backoff),
        (_, Idempotency::NotIdempotent) => Decision::GiveUp,
        (Outcome::ConnectionLost, Idempotency::Idempotent) => Decision::RetryAfter(backoff),
        (
            Outcome::Status {
                status,
                should_retry,
                retry_after,
                sandbox_gone,
            },
            Idempotency::Idempotent,
        ) => {
            let retryable = match should_retry {
                Some(explicit) => explicit,
                None => is_transient_status(status) && !sandbox_gone,
            };
            if !retryable {
                return Decision::GiveUp;
            }
            match retry_after {
                Some(wait) => Decision::RetryAfter(wait.min(policy.max_backoff)),
                None => Decision::RetryAfter(backoff),
            }
        }
    }
}

/// `initial * 2^n`, capped at `max_backoff`, then jittered into `[half, full]`.
fn backoff(policy: &RetryPolicy, retries_done: u32, jitter: f64) -> Duration {
    let factor = 2u32.saturating_pow(retries_done.min(30));
    let full = policy
        .initial_backoff
        .saturating_mul(factor)
        .min(policy.max_backoff);
    let half = full / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// Reads `Should-Retry: true|false`; anything else counts as absent.
pub(crate) fn should_retry(headers: &HeaderMap) -> Option<bool> {
    let value = headers.get("should-retry")?.to_str().ok()?.trim();
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Reads `Retry-After: <seconds>`; HTTP dates and garbage count as absent, huge values are kept
/// for the caller to clamp.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("retry-after")?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let secs = value.parse::<f64>().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::config::Jitter;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            jitter: Jitter::None,
        }
    }

    fn status(status: u16) -> Outcome {
        Outcome::Status {
            status,
            should_retry: None,
            retry_after: None,
            sandbox_gone: false,
        }
    }

    use Idempotency::{Idempotent, NotIdempotent};

    #[test]
    fn transient_statuses_are_retried_with_doubling_backoff() {
        for code in [429, 502, 503, 504] {
            assert_eq!(
                decide(&policy(), Idempotent, 0, status(code), 1.0),
                Decision::RetryAfter(Duration::from_millis(100))
            );
        }
        assert_eq!(
            decide(&policy(), Idempotent, 2, status(503), 1.0),
            Decision::RetryAfter(Duration::from_millis(400))
        );
        // Capped at max_backoff.
        assert_eq!(
            decide(&policy(), Idempotent, 2, status(503), 1.0),
            decide(
                &RetryPolicy {
                    max_backoff: Duration::from_secs(9),
                    ..policy()
                },
                Idempotent,
                2,
                status(503),
                1.0
            )
        );
        let capped = RetryPolicy {
            max_retries: 40,
            ..policy()
        };
        assert_eq!(
            decide(&capped, Idempotent, 35, status(503), 1.0),
            Decision::RetryAfter(Duration::from_secs(1))
        );
    }

    #[test]
    fn other_statuses_and_exhaustion_give_up() {
        for code in [400, 401, 404, 409, 500, 501] {
            assert_eq!(
                decide(&policy(), Idempotent, 0, status(code), 1.0),
                Decision::GiveUp
            );
        }
        assert_eq!(
            decide(&policy(), Idempotent, 3, status(503), 1.0),
            Decision::GiveUp
        );
        assert_eq!(
            decide(
                &RetryPolicy::none(),
                Idempotent,
                0,
                Outcome::ConnectFailed,
                1.0
            ),
            Decision::GiveUp
        );
    }

    #[test]
    fn should_retry_header_overrides_the_status() {
        let no = Outcome::Status {
            status: 503,
            should_retry: Some(false),
            retry_after: None,
            sandbox_gone: false,
        };
        assert_eq!(decide(&policy(), Idempotent, 0, no, 1.0), Decision::GiveUp);
        let yes = Outcome::Status {
            status: 500,
            should_retry: Some(true),
            retry_after: None,
            sandbox_gone: false,
        };
        assert_eq!(
            decide(&policy(), Idempotent, 0, yes, 1.0),
            Decision::RetryAfter(Duration::from_millis(100))
        );
    }

    #[test]
    fn retry_after_is_honoured_and_clamped() {
        let outcome = |secs| Outcome::Status {
            status: 429,
            should_retry: None,
            retry_after: Some(Duration::from_secs(secs)),
            sandbox_gone: false,
        };
        assert_eq!(
            decide(&policy(), Idempotent, 0, outcome(0), 1.0),
            Decision::RetryAfter(Duration::ZERO)
        );
        assert_eq!(
            decide(&policy(), Idempotent, 0, outcome(3600), 1.0),
            Decision::RetryAfter(Duration::from_secs(1))
        );
    }

    #[test]
    fn sandbox_gone_is_not_retried() {
        let gone = Outcome::Status {
            status: 502,
            should_retry: None,
            retry_after: None,
            sandbox_gone: true,
        };
        assert_eq!(
            decide(&policy(), Idempotent, 0, gone, 1.0),
            Decision::GiveUp
        );
    }

    #[test]
    fn non_idempotent_requests_retry_only_unsent_ones() {
        assert_eq!(
            decide(&policy(), NotIdempotent, 0, Outcome::ConnectFailed, 1.0),
            Decision::RetryAfter(Duration::from_millis(100))
        );
        assert_eq!(
            decide(&policy(), NotIdempotent, 0, Outcome::ConnectionLost, 1.0),
            Decision::GiveUp
        );
        assert_eq!(
            decide(&policy(), NotIdempotent, 0, status(503), 1.0),
            Decision::GiveUp
        );
        let told = Outcome::Status {
            status: 503,
            should_retry: Some(true),
            retry_after: None,
            sandbox_gone: false,
        };
        assert_eq!(
            decide(&policy(), NotIdempotent, 0, told, 1.0),
            Decision::GiveUp
        );
        assert_eq!(
            decide(&policy(), Idempotent, 0, Outcome::ConnectionLost, 1.0),
            Decision::RetryAfter(Duration::from_millis(100))
        );
    }

    #[test]
    fn jitter_spreads_between_half_and_full() {
        assert_eq!(
            decide(&policy(), Idempotent, 1, status(503), 0.0),
            Decision::RetryAfter(Duration::from_millis(100))
        );
        assert_eq!(
            decide(&policy(), Idempotent, 1, status(503), 0.5),
            Decision::RetryAfter(Duration::from_millis(150))
        );
    }

    #[test]
    fn headers_are_parsed_strictly() {
        let mut headers = HeaderMap::new();
        assert_eq!(should_retry(&headers), None);
        assert_eq!(retry_after(&headers), None);
        headers.insert("should-retry", HeaderValue::from_static("FALSE"));
        headers.insert("retry-after", HeaderValue::from_static("7"));
        assert_eq!(should_retry(&headers), Some(false));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert("should-retry", HeaderValue::from_static("maybe"));
        headers.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(should_retry(&headers), None);
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("-3"));
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("0.25"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
    }
}
