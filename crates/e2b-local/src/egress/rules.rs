//! E2B's egress rules: the `network` a sandbox was created or updated with, checked as E2B
//! documents them, and the policy they make (which destination a connection may reach).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::transform::{EgressProxy, Rule, Secret};

/// The ports where a domain entry of `allowOut` is matched, by HTTP `Host` (80) and TLS
/// SNI (443), as E2B documents; other ports fall back to address rules.
pub(crate) const HTTP_PORT: u16 = 80;
pub(crate) const TLS_PORT: u16 = 443;

/// DNS, which stays reachable on the sandbox's name servers when `allowOut` has a domain.
const DNS_PORT: u16 = 53;

/// A sandbox's network configuration as stored and reported (`SandboxNetworkConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NetworkRecord {
    pub(crate) allow_out: Vec<String>,
    pub(crate) deny_out: Vec<String>,
    #[serde(default)]
    pub(crate) allow_public_traffic: Option<bool>,
    #[serde(default)]
    pub(crate) mask_request_host: Option<String>,
    /// E2B 2.63's `dnsServers`: reachable on every port when `allowOut` has a domain.
    #[serde(default)]
    pub(crate) dns_servers: Option<Vec<String>>,
    /// `rules`: per-domain transforms (headers set on the domain's requests).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) rules: BTreeMap<String, Vec<Rule>>,
    /// `egressProxy`, password included (the detail leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) egress_proxy: Option<EgressProxy>,
}

/// An address block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn contains(self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            // ALL_TRAFFIC covers IPv6 too: E2B sandboxes have no IPv6 route at all, so
            // "deny everything" must not leave one open here.
            (IpAddr::V4(net), IpAddr::V6(_)) => self.prefix == 0 && net.is_unspecified(),
            (IpAddr::V6(_), IpAddr::V4(_)) => false,
        }
    }
}

/// One entry of `allowOut` or `denyOut`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    Net(Net),
    /// Lowercase, without a trailing dot; `wildcard` for `*.name` (subdomains only).
    Domain {
        name: String,
        wildcard: bool,
    },
}

fn parse_entry(raw: &str) -> Option<Entry> {
    let text = raw.trim();
    if let Some((addr, prefix)) = text.split_once('/') {
        let addr: IpAddr = addr.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= max)?;
        return Some(Entry::Net(Net { addr, prefix }));
    }
    if let Ok(addr) = text.parse::<IpAddr>() {
        let prefix = if addr.is_ipv4() { 32 } else { 128 };
        return Some(Entry::Net(Net { addr, prefix }));
    }
    let lower = text.trim_end_matches('.').to_ascii_lowercase();
    let (name, wildcard) = match lower.strip_prefix("*.") {
        Some(rest) => (rest.to_owned(), true),
        None => (lower, false),
    };
    let valid =
        !name.is_empty() && name.len() <= 253 && name.split('.').all(super::transform::label_ok);
    // A name of digits and dots only is a malformed address, not a domain.
    let numeric = name.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    (valid && !numeric).then_some(Entry::Domain { name, wildcard })
}

/// What may be reached: compiled from a [`NetworkRecord`] (and `allow_internet_access`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    allow_nets: Vec<Net>,
    allow_domains: Vec<(String, bool)>,
    deny_nets: Vec<Net>,
    /// Reachable on port 53 (`None`: any port, E2B's `dnsServers`).
    dns: Vec<(IpAddr, Option<u16>)>,
    /// `rules`: names whose HTTP(S) requests get headers set (see `super::intercept`).
    rules: BTreeMap<String, Vec<Rule>>,
    /// `egressProxy`: the SOCKS5 proxy allowed TCP goes through.
    egress_proxy: Option<EgressProxy>,
    /// The sandbox's resolvers, whose DNS is never tunnelled.
    resolvers: Vec<IpAddr>,
}

/// What a connection to one destination gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allow,
    Deny,
    /// Only if the name it asks for (HTTP `Host`, TLS SNI) is allowed.
    ByName,
}

impl Policy {
    /// Checks and compiles rules. `name_servers` are the sandbox's resolvers, reachable
    /// for DNS when a domain is allowed and `dnsServers` was not given. The error says
    /// which entry is wrong and why, as the 400 text.
    pub(crate) fn compile(
        network: Option<&NetworkRecord>,
        allow_internet_access: Option<bool>,
        name_servers: &[IpAddr],
    ) -> Result<Policy, String> {
        let mut policy = Policy {
            allow_nets: Vec::new(),
            allow_domains: Vec::new(),
            deny_nets: Vec::new(),
            dns: Vec::new(),
            rules: BTreeMap::new(),
            egress_proxy: None,
            resolvers: name_servers.to_vec(),
        };
        if let Some(network) = network {
            policy.rules = network.rules.clone();
            policy.egress_proxy = network.egress_proxy.clone();
            for raw in &network.allow_out {
                match parse_entry(raw) {
                    Some(Entry::Net(net)) => policy.allow_nets.push(net),
                    Some(Entry::Domain { name, wildcard }) => {
                        policy.allow_domains.push((name, wildcard));
                    }
                    None => {
                        return Err(format!(
                            "allowOut entry '{raw}' is neither an IP address, a CIDR block nor a domain name"
                        ));
                    }
                }
            }
            for raw in &network.deny_out {
                match parse_entry(raw) {
                    Some(Entry::Net(net)) => policy.deny_nets.push(net),
                    Some(Entry::Domain { .. }) => {
                        return Err(format!(
                            "denyOut entry '{raw}' is a domain name: domain names are supported only in allowOut, denyOut takes IP addresses and CIDR blocks"
                        ));
                    }
                    None => {
                        return Err(format!(
                            "denyOut entry '{raw}' is neither an IP address nor a CIDR block"
                        ));
                    }
                }
            }
            match &network.dns_servers {
                Some(servers) => {
                    for raw in servers {
                        let ip: Ipv4Addr = raw.trim().parse().map_err(|_| {
                            format!("dnsServers entry '{raw}' is not an IPv4 address")
                        })?;
                        policy.dns.push((IpAddr::V4(ip), None));
                    }
                }
                None => policy
                    .dns
                    .extend(name_servers.iter().map(|ip| (*ip, Some(DNS_PORT)))),
            }
            if policy.allow_domains.is_empty() {
                policy.dns.clear();
            }
        }
        if allow_internet_access == Some(false) {
            policy.deny_nets.push(Net {
                addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                prefix: 0,
            });
        }
        Ok(policy)
    }

    /// Whether every destination but the sandbox's own loopback is denied.
    pub(crate) fn denies_everything(&self) -> bool {
        self.allow_nets.is_empty()
            && self.allow_domains.is_empty()
            && self.dns.is_empty()
            && self
                .deny_nets
                .iter()
                .any(|net| net.prefix == 0 && net.addr.is_ipv4())
    }

    /// Whether anything is denied, rewritten or tunnelled at all (a policy that does none
    /// needs no filter; header rules and a proxy need it to see the connections).
    pub(crate) fn restricts(&self) -> bool {
        !self.deny_nets.is_empty() || !self.rules.is_empty() || self.egress_proxy.is_some()
    }

    /// The SOCKS5 proxy allowed TCP goes through, if any.
    pub(crate) fn egress_proxy(&self) -> Option<&EgressProxy> {
        self.egress_proxy.as_ref()
    }

    /// Whether `ip:port` is one of the sandbox's name servers for DNS (not tunnelled: the
    /// resolver the sandbox was given is the host's, which a proxy elsewhere may not reach).
    pub(crate) fn is_dns(&self, ip: IpAddr, port: u16) -> bool {
        let ip = unmapped(ip);
        (port == DNS_PORT && self.resolvers.contains(&ip))
            || self
                .dns
                .iter()
                .any(|(server, only)| *server == ip && only.is_none_or(|p| p == port))
    }

    /// Whether connections to ports 80 and 443 must go through the proxy even when
    /// allowed, because some name has header rules.
    pub(crate) fn has_header_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The headers a request for `host` gets set (HTTP `Host` or TLS SNI).
    pub(crate) fn headers_for(&self, host: &str) -> Option<&BTreeMap<String, Secret>> {
        super::transform::headers_for(&self.rules, host)
    }

    /// The verdict for a TCP connection to `ip:port`. The sandbox's own loopback address
    /// (127.0.0.1, ::1, and the unspecified address, which means it) is always reachable;
    /// the rest of 127.0.0.0/8 follows the rules like any address.
    pub(crate) fn verdict(&self, ip: IpAddr, port: u16) -> Verdict {
        let ip = unmapped(ip);
        let own = ip == IpAddr::V4(Ipv4Addr::LOCALHOST)
            || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
            || ip.is_unspecified();
        if own {
            Verdict::Allow
        } else {
            self.remote_verdict(ip, port)
        }
    }

    /// The verdict for `ip:port` judged as a host elsewhere, even on loopback: what
    /// e2b-local's own API gets, which on E2B is a host on the internet.
    pub(crate) fn remote_verdict(&self, ip: IpAddr, port: u16) -> Verdict {
        let ip = unmapped(ip);
        if self.allow_nets.iter().any(|net| net.contains(ip)) {
            return Verdict::Allow;
        }
        let dns = self
            .dns
            .iter()
            .any(|(server, only)| *server == ip && only.is_none_or(|p| p == port));
        if dns || !self.deny_nets.iter().any(|net| net.contains(ip)) {
            return Verdict::Allow;
        }
        if (port == HTTP_PORT || port == TLS_PORT) && !self.allow_domains.is_empty() {
            Verdict::ByName
        } else {
            Verdict::Deny
        }
    }

    /// Whether a host name (HTTP `Host` without port, or TLS SNI) is allowed by a domain
    /// entry: exactly, or as a subdomain of a `*.` entry.
    pub(crate) fn allows_name(&self, host: &str) -> bool {
        let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
        self.allow_domains.iter().any(|(name, wildcard)| {
            if *wildcard {
                host.len() > name.len()
                    && host.ends_with(name.as_str())
                    && host.as_bytes()[host.len() - name.len() - 1] == b'.'
            } else {
                host == *name
            }
        })
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub(crate) fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The IPv4 and IPv6 name servers of a resolv.conf text.
pub(crate) fn name_servers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_TRAFFIC: &str = "0.0.0.0/0";

    fn record(allow: &[&str], deny: &[&str]) -> NetworkRecord {
        NetworkRecord {
            allow_out: allow.iter().map(|s| (*s).to_owned()).collect(),
            deny_out: deny.iter().map(|s| (*s).to_owned()).collect(),
            allow_public_traffic: None,
            mask_request_host: None,
            dns_servers: None,
            rules: BTreeMap::new(),
            egress_proxy: None,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn allow_beats_deny_and_domains_decide_only_on_80_and_443() {
        let rec = record(
            &["10.1.0.0/16", "*.example.com", "api.test"],
            &[ALL_TRAFFIC],
        );
        let policy = Policy::compile(Some(&rec), None, &[ip("10.255.255.53")]).expect("valid");
        assert_eq!(policy.verdict(ip("10.1.2.3"), 22), Verdict::Allow);
        assert_eq!(policy.verdict(ip("10.2.0.1"), 22), Verdict::Deny);
        assert_eq!(policy.verdict(ip("10.2.0.1"), 80), Verdict::ByName);
        assert_eq!(policy.verdict(ip("10.2.0.1"), 443), Verdict::ByName);
        assert_eq!(policy.verdict(ip("127.0.0.1"), 9), Verdict::Allow);
        assert_eq!(policy.remote_verdict(ip("127.0.0.1"), 9), Verdict::Deny);
        assert_eq!(policy.verdict(ip("127.0.0.2"), 9), Verdict::Deny);
        assert_eq!(policy.verdict(ip("::ffff:10.1.0.9"), 9), Verdict::Allow);
        assert_eq!(policy.verdict(ip("2001:db8::1"), 9), Verdict::Deny);
        // The resolver stays reachable for DNS only.
        assert_eq!(policy.verdict(ip("10.255.255.53"), 53), Verdict::Allow);
        assert_eq!(policy.verdict(ip("10.255.255.53"), 54), Verdict::Deny);
        assert!(policy.allows_name("a.b.example.com"));
        assert!(policy.allows_name("API.test."));
        assert!(!policy.allows_name("example.com"));
        assert!(!policy.allows_name("badexample.com"));
    }

    #[test]
    fn deny_lists_deny_only_what_they_name() {
        let policy =
            Policy::compile(Some(&record(&[], &["10.0.0.0/8"])), None, &[]).expect("valid");
        assert_eq!(policy.verdict(ip("10.9.9.9"), 80), Verdict::Deny);
        assert_eq!(policy.verdict(ip("11.0.0.1"), 80), Verdict::Allow);
        let open = Policy::compile(Some(&record(&["1.1.1.1"], &[])), None, &[]).expect("valid");
        assert!(!open.restricts());
        let offline = Policy::compile(None, Some(false), &[]).expect("valid");
        assert!(offline.restricts());
        assert_eq!(offline.verdict(ip("8.8.8.8"), 53), Verdict::Deny);
    }

    #[test]
    fn malformed_entries_and_deny_domains_are_refused_with_the_entry() {
        let error = Policy::compile(Some(&record(&[], &["example.com"])), None, &[])
            .expect_err("deny domain");
        assert!(error.contains("'example.com'") && error.contains("only in allowOut"));
        for bad in ["1.2.3.4/33", "not a host", "*", "300.1.1.1", "-x.com"] {
            assert!(
                Policy::compile(Some(&record(&[bad], &[])), None, &[]).is_err(),
                "{bad}"
            );
        }
    }
}
