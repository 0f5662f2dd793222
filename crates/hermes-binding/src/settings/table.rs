//! The one table of the plugin's settings: key, kind, default, environment variable and
//! description. The `_native.SETTINGS` schema, the shim's `plugin.yaml` `config_schema` and the
//! README's table are rendered from or checked against it.
//!
//! Defaults are not written here: a fixed default is read out of a fresh
//! [`agent_sandbox::Config::new`], the one place the core writes it, so the table cannot
//! drift from what the backend applies.

use agent_sandbox::{ApiKeySource, Config, InternetAccess, MAX_TURN_KEEP, Security};

use super::AdapterSettings;
use std::sync::Arc;

/// The longest lease or grace a setting may ask for: one day (E2B's own maximum is
/// account-specific; a larger value is almost certainly a unit mistake).
pub const MAX_SETTING_SECONDS: u64 = 86_400;

/// What kind of value a setting takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingKind {
    /// Text: a name, a path, a URL or an id.
    Text,
    /// Whole seconds, from `min` up to [`MAX_SETTING_SECONDS`].
    Seconds {
        /// The smallest accepted value.
        min: u64,
    },
    /// `true` or `false`.
    Flag,
    /// A mapping of names to text (or its text form).
    Mapping,
    /// A list of text (or its text form: entries separated by commas or spaces).
    List,
    /// A whole number from `min` to `max`.
    Count {
        /// The smallest accepted value.
        min: u64,
        /// The largest accepted value.
        max: u64,
    },
}

impl SettingKind {
    /// The type in Hermes' dashboard schema (`get_config_schema`), which has no mapping type:
    /// its config screens hand such values over as text.
    pub fn dashboard_type(self) -> &'static str {
        match self {
            SettingKind::Text => "string",
            SettingKind::Seconds { .. } => "number",
            SettingKind::Flag => "boolean",
            SettingKind::Mapping => "text",
            SettingKind::List => "list",
            SettingKind::Count { .. } => "number",
        }
    }

    /// The type in the manifest's `config_schema` (what Hermes' loader checks values against).
    pub fn manifest_type(self) -> &'static str {
        match self {
            SettingKind::Text => "string",
            SettingKind::Seconds { .. } => "integer",
            SettingKind::Flag => "boolean",
            SettingKind::Mapping => "object",
            SettingKind::List => "list",
            SettingKind::Count { .. } => "integer",
        }
    }

    /// The type as the README's table writes it.
    pub fn readme_type(self) -> String {
        match self {
            SettingKind::Text => "text".to_owned(),
            SettingKind::Seconds { min } => format!("seconds ({min}..{MAX_SETTING_SECONDS})"),
            SettingKind::Flag => "true/false".to_owned(),
            SettingKind::Mapping => "mapping".to_owned(),
            SettingKind::List => "list".to_owned(),
            SettingKind::Count { min, max } => format!("count ({min}..{max})"),
        }
    }
}

/// A fixed default, as read out of a [`Config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fixed {
    /// This text.
    Text(String),
    /// This many seconds.
    Seconds(u64),
    /// This flag.
    Flag(bool),
    /// This count.
    Count(u64),
}

impl Fixed {
    /// As YAML and the README write it.
    pub fn render(&self) -> String {
        match self {
            Fixed::Text(text) => text.clone(),
            Fixed::Seconds(seconds) => seconds.to_string(),
            Fixed::Flag(flag) => flag.to_string(),
            Fixed::Count(count) => count.to_string(),
        }
    }
}

impl Fixed {
    /// As the README's table writes it: text as code, numbers and flags plain.
    pub fn readme(&self) -> String {
        match self {
            Fixed::Text(text) => format!("`{text}`"),
            Fixed::Seconds(_) | Fixed::Flag(_) | Fixed::Count(_) => self.render(),
        }
    }
}

/// Where a setting's default comes from.
#[derive(Clone, Copy)]
pub enum SettingDefault {
    /// The value [`Config::new`] applies, read out of it.
    Config(fn(&Config) -> Fixed),
    /// Hermes' `terminal.lifetime_seconds`, else the value [`Config::new`] applies. No schema
    /// states it: a stated default would be filled in by Hermes and win over the lifetime.
    Lifetime(fn(&Config) -> Fixed),
    /// The plugin's own value ([`AdapterSettings::defaults`]): settings of the Hermes
    /// adapter, not of the backend.
    Plugin(fn(&AdapterSettings) -> Fixed),
    /// Unset; what applies instead, as the README says it.
    Unset(&'static str),
}

impl std::fmt::Debug for SettingDefault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SettingDefault::Config(read) => write!(f, "Config({:?})", read(&core_defaults())),
            SettingDefault::Lifetime(read) => write!(f, "Lifetime({:?})", read(&core_defaults())),
            SettingDefault::Plugin(read) => {
                write!(f, "Plugin({:?})", read(&AdapterSettings::defaults()))
            }
            SettingDefault::Unset(instead) => write!(f, "Unset({instead:?})"),
        }
    }
}

/// One setting under `plugins.entries.e2b.settings`.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The key, as users write it.
    pub key: &'static str,
    /// What it takes.
    pub kind: SettingKind,
    /// Its default.
    pub default: SettingDefault,
    /// The environment variable read when none of the endpoint settings is set (E2B's own).
    pub env: Option<&'static str>,
    /// The description's own text; screens show [`Setting::schema_description`], which adds
    /// what the text cannot hold (a derived default's value, a mapping's text form).
    pub description: &'static str,
}

/// A `Config` with the core's defaults, to read them from. The key source is never consulted.
pub(crate) fn core_defaults() -> Config {
    Config::new(ApiKeySource::Resolver(Arc::new(|| None)))
}

impl Setting {
    /// The entry for `key`, if the plugin has such a setting.
    ///
    /// ```
    /// use _native::settings::table::{Fixed, Setting, SettingKind};
    ///
    /// assert_eq!(Setting::find("lease_seconds").unwrap().kind, SettingKind::Seconds { min: 1 });
    /// assert_eq!(Setting::find("template").unwrap().fixed_default(), Some(Fixed::Text("base".into())));
    /// assert!(Setting::find("image").is_none());
    /// ```
    pub fn find(key: &str) -> Option<&'static Setting> {
        SETTINGS.iter().find(|setting| setting.key == key)
    }

    /// The default a schema states: only a fixed one.
    pub fn fixed_default(&self) -> Option<Fixed> {
        match self.default {
            SettingDefault::Config(read) => Some(read(&core_defaults())),
            SettingDefault::Plugin(read) => Some(read(&AdapterSettings::defaults())),
            SettingDefault::Lifetime(_) | SettingDefault::Unset(_) => None,
        }
    }

    /// The description configuration screens show. A lifetime-derived default adds its
    /// fallback (read from `Config::new`, so no number is written here); a mapping's adds its
    /// text form, which `settings.rs` parses when a screen hands the mapping over as text.
    pub fn schema_description(&self) -> String {
        if let SettingDefault::Lifetime(read) = self.default {
            format!(
                "{}, else {}.",
                self.description,
                read(&core_defaults()).render()
            )
        } else if self.kind == SettingKind::Mapping && self.key == "credentials" {
            format!("{} As text: a JSON object.", self.description)
        } else if self.kind == SettingKind::Mapping {
            format!(
                "{} As text: key=value pairs separated by commas or new lines, or a JSON object.",
                self.description
            )
        } else if self.kind == SettingKind::List {
            format!(
                "{} As text: entries separated by commas or spaces.",
                self.description
            )
        } else {
            self.description.to_owned()
        }
    }

    /// The README table's default column.
    pub fn readme_default(&self) -> String {
        let core = core_defaults();
        let unset = match self.default {
            SettingDefault::Config(read) => return read(&core).readme(),
            SettingDefault::Plugin(read) => return read(&AdapterSettings::defaults()).readme(),
            SettingDefault::Lifetime(read) => {
                return format!("`terminal.lifetime_seconds`, else {}", read(&core).readme());
            }
            SettingDefault::Unset(instead) => instead,
        };
        match self.env {
            Some(var) => format!("`{var}`, else {unset}"),
            None => unset.to_owned(),
        }
    }
}

fn seconds(duration: std::time::Duration) -> Fixed {
    Fixed::Seconds(duration.as_secs())
}

/// Every setting, in the order configuration screens show them.
pub const SETTINGS: [Setting; 30] = [
    Setting {
        key: "template",
        kind: SettingKind::Text,
        default: SettingDefault::Config(|config| Fixed::Text(config.template.clone())),
        env: None,
        description: "E2B template name or id (part of the sandbox identity).",
    },
    Setting {
        key: "cwd",
        kind: SettingKind::Text,
        // Learned at attach: no path is assumed (contract L13).
        default: SettingDefault::Unset("the sandbox user's `$HOME`"),
        env: None,
        description: "Starting directory in the sandbox; defaults to the sandbox user's $HOME.",
    },
    Setting {
        key: "lease_seconds",
        kind: SettingKind::Seconds { min: 1 },
        default: SettingDefault::Lifetime(|config| seconds(config.lease)),
        env: None,
        // `schema_description` appends the fallback, read from `Config::new`.
        description: "Baseline sandbox lease; defaults to terminal.lifetime_seconds",
    },
    Setting {
        key: "command_grace_seconds",
        kind: SettingKind::Seconds { min: 0 },
        default: SettingDefault::Config(|config| seconds(config.command_grace)),
        env: None,
        description: "Lease headroom beyond a command's deadline.",
    },
    Setting {
        key: "watchdog_grace_seconds",
        kind: SettingKind::Seconds { min: 1 },
        default: SettingDefault::Config(|config| seconds(config.watchdog_grace)),
        env: None,
        description: "How long past its own time a tool call may wait for the sandbox before the watchdog ends it.",
    },
    Setting {
        key: "max_running",
        kind: SettingKind::Count {
            min: 1,
            max: MAX_RUNNING,
        },
        default: SettingDefault::Unset("none (only E2B's account limit)"),
        env: None,
        description: "At most this many of this Hermes process's sandboxes run at once: before another starts, the one idle longest is paused (it resumes on its next command). Set it at or below the E2B account's limit of concurrently running sandboxes.",
    },
    Setting {
        key: "slot_wait_seconds",
        kind: SettingKind::Seconds { min: 0 },
        default: SettingDefault::Config(|config| seconds(config.slot_wait)),
        env: None,
        description: "When E2B's limit of concurrently running sandboxes refuses a start and none of this process's sandboxes is idle to pause, how long the command waits for a slot before it fails.",
    },
    Setting {
        key: "pause_after_idle_seconds",
        kind: SettingKind::Seconds { min: 1 },
        default: SettingDefault::Unset("lease_seconds"),
        env: None,
        description: "A chat's sandbox is paused this long after its last command or file operation, whatever a command's timeout asked of the lease (the quiet running time you pay for); polls of background processes do not count as commands. Its next command resumes it, with what ran in it frozen meanwhile.",
    },
    Setting {
        key: "skills_in_chat_sandboxes",
        kind: SettingKind::Flag,
        default: SettingDefault::Plugin(|a| Fixed::Flag(a.skills_in_chat_sandboxes)),
        env: None,
        description: "Push the profile's skills into gateway chats' sandboxes. Hermes shares skills profile-wide (a skill one chat's agent writes is every chat's); false keeps them out of every chat's sandbox (the CLI's sandbox still gets them; skills a chat's agent writes are still pulled).",
    },
    Setting {
        key: "subagents",
        kind: SettingKind::Text,
        default: SettingDefault::Plugin(|a| Fixed::Text(a.subagents.as_str().to_owned())),
        env: None,
        description: "Where delegated children (delegate_task) work: shared (the parent's sandbox, as Hermes does on remote backends) or fork (each in its own fork of the parent's sandbox, made at its first tool call; its work comes back when it ends: each git work tree it changed as a hermes-subagent/<id> branch, every other file it changed under its home, working directory, the directories its commands ran in and subagent_paths, a file both changed kept with the child's version beside it; what it changed elsewhere is named). Hermes' delegation.worktree_isolation: true also selects fork.",
    },
    Setting {
        key: "subagent_paths",
        kind: SettingKind::List,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "Directories outside the sandbox user's home whose changes come back from a subagent's fork like the home's (/workspace, /srv/app): absolute. The home (less its caches), the child's working directory and the directories its commands ran in always come back; what it changed elsewhere is named in the delegate_task result, not copied.",
    },
    Setting {
        key: "subagent_forks",
        kind: SettingKind::Text,
        default: SettingDefault::Plugin(|a| Fixed::Text(a.subagent_forks.as_str().to_owned())),
        env: None,
        description: "What becomes of a subagent's fork once its work is back: kill, or keep (paused, a checkpoint of the child's whole sandbox; hermes e2b list shows it, hermes e2b rm removes it).",
    },
    Setting {
        key: "live_tools",
        kind: SettingKind::Flag,
        default: SettingDefault::Plugin(|a| Fixed::Flag(a.live_tools)),
        env: None,
        description: "execute_code cells run in a live Python kernel in the sandbox (one request per cell; tool calls travel on its stream) and terminal(background=true) processes stream their output, take stdin (process_manage write/submit/close) and pty=true; nothing polls. false leaves Hermes' own polling paths (a command per poll). A Hermes whose internals the plugin cannot use keeps its own paths either way; hermes e2b doctor says which is in force.",
    },
    Setting {
        key: "allow_internet_access",
        kind: SettingKind::Flag,
        default: SettingDefault::Config(|config| {
            Fixed::Flag(config.internet == InternetAccess::Allowed)
        }),
        env: None,
        description: "false puts the sandbox behind deny-all egress.",
    },
    Setting {
        key: "allow_out",
        kind: SettingKind::List,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "Destinations the sandbox may reach even when deny_out covers them: IPv4 addresses, CIDR blocks, domain names (*.example.com for subdomains; matched on HTTP and TLS, ports 80 and 443). Applied live.",
    },
    Setting {
        key: "deny_out",
        kind: SettingKind::List,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "Destinations the sandbox may not reach: IPv4 addresses and CIDR blocks (0.0.0.0/0: all). Applied live.",
    },
    Setting {
        key: "credentials",
        kind: SettingKind::Mapping,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "Variables whose real value E2B's egress adds as a header for their hosts while the sandbox sees only a stand-in: NAME: {hosts: [api.github.com], header: Authorization, format: \"Bearer {value}\"}. Values come from the profile's .env, never from here. Applied live.",
    },
    Setting {
        key: "egress_proxy",
        kind: SettingKind::Text,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "A SOCKS5 proxy every allowed TCP connection of the sandbox goes through (E2B's network.egressProxy): socks5://[user@]host:port. With a user, the password is E2B_EGRESS_PROXY_PASSWORD in the profile's .env, never here. Applied live.",
    },
    Setting {
        key: "credential_store",
        kind: SettingKind::Text,
        default: SettingDefault::Config(|config| {
            Fixed::Text(config.credential_store.as_str().to_owned())
        }),
        env: None,
        description: "Where credentials' values are kept for E2B's egress: auto (E2B Secrets, one per profile and variable, so sandboxes' rules hold only a placeholder; the rules themselves where the account or server has no Secrets), secrets (Secrets or no command), rules (the value in each sandbox's rules, which E2B's sandbox detail shows).",
    },
    Setting {
        key: "secure",
        kind: SettingKind::Flag,
        default: SettingDefault::Config(|config| Fixed::Flag(config.security == Security::Secure)),
        env: None,
        description: "Keep E2B's envd access-token protection on.",
    },
    Setting {
        key: "metadata",
        kind: SettingKind::Mapping,
        default: SettingDefault::Unset("`{}`"),
        env: None,
        description: "Extra metadata stamped on every sandbox (identity keys win).",
    },
    Setting {
        key: "domain",
        kind: SettingKind::Text,
        default: SettingDefault::Unset("E2B cloud"),
        env: Some("E2B_DOMAIN"),
        description: "E2B domain (self-hosted E2B).",
    },
    Setting {
        key: "api_url",
        kind: SettingKind::Text,
        default: SettingDefault::Unset("derived from `domain`"),
        env: Some("E2B_API_URL"),
        description: "E2B control-plane URL override.",
    },
    Setting {
        key: "sandbox_url",
        kind: SettingKind::Text,
        default: SettingDefault::Unset("derived from `domain`"),
        env: Some("E2B_SANDBOX_URL"),
        description: "E2B envd URL override.",
    },
    Setting {
        key: "writer_arbitration",
        kind: SettingKind::Text,
        default: SettingDefault::Config(|config| {
            Fixed::Text(config.writer_arbitration.as_str().to_owned())
        }),
        env: None,
        description: "Who picks the one writer: host (file lock, one machine) or sandbox (a fenced record in the sandbox, for several hosts).",
    },
    Setting {
        key: "sandbox_id",
        kind: SettingKind::Text,
        default: SettingDefault::Unset("none"),
        env: None,
        description: "Attach to this externally owned sandbox instead.",
    },
    Setting {
        key: "checkpoint_at_start",
        kind: SettingKind::Flag,
        default: SettingDefault::Plugin(|a| Fixed::Flag(a.checkpoints.at_session_start)),
        env: None,
        description: "Take a checkpoint (an E2B snapshot) when a session first uses its sandbox; older automatic ones beyond checkpoint_keep are deleted.",
    },
    Setting {
        key: "checkpoint_keep",
        kind: SettingKind::Count {
            min: 1,
            max: MAX_KEEP,
        },
        default: SettingDefault::Plugin(|a| Fixed::Count(a.checkpoints.keep as u64)),
        env: None,
        description: "Automatic checkpoints kept per scope; named ones are never deleted.",
    },
    Setting {
        key: "checkpoint_tool",
        kind: SettingKind::Flag,
        default: SettingDefault::Plugin(|a| Fixed::Flag(a.checkpoints.agent_tool)),
        env: None,
        description: "Give the agent the sandbox_checkpoint tool (checkpoint before a risky step, list, restore after a failure).",
    },
    Setting {
        key: "turn_checkpoints",
        kind: SettingKind::Count {
            min: 0,
            max: MAX_TURN_KEEP as u64,
        },
        default: SettingDefault::Plugin(|a| Fixed::Count(a.checkpoints.turns as u64)),
        env: None,
        description: "Turn-level file checkpoints kept inside the sandbox (a tar of the working directory before each turn's first file change); 0 turns them off.",
    },
];

/// The largest `max_running`: far above any E2B plan's limit.
pub const MAX_RUNNING: u64 = 10_000;

/// The most automatic checkpoints `checkpoint_keep` may keep.
pub const MAX_KEEP: u64 = 100;

/// The `config_schema:` section of the shim's `plugin/plugin.yaml`, to the end of the file.
/// The committed file must equal it (a test checks); Hermes reads it at load, before any
/// native code runs, so it cannot be produced at run time.
pub fn plugin_yaml_config_schema() -> String {
    let mut out = String::from("config_schema:\n");
    for setting in &SETTINGS {
        out.push_str(&format!("  {}:\n", setting.key));
        out.push_str(&format!("    type: {}\n", setting.kind.manifest_type()));
        if let Some(default) = setting.fixed_default() {
            // Numbers and flags stay plain so YAML reads them as such.
            let default = match default {
                Fixed::Text(text) => yaml_scalar(&text),
                Fixed::Seconds(_) | Fixed::Flag(_) | Fixed::Count(_) => default.render(),
            };
            out.push_str(&format!("    default: {default}\n"));
        }
        out.push_str(&format!(
            "    description: {}\n",
            yaml_scalar(&setting.schema_description())
        ));
    }
    out
}

/// `text` as a YAML scalar that reads back as the same string: plain where YAML allows it,
/// else double-quoted.
fn yaml_scalar(text: &str) -> String {
    let indicator = text.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@`".contains(c));
    let reserved = matches!(
        text,
        "" | "true" | "false" | "null" | "~" | "yes" | "no" | "on" | "off"
    );
    let numeric = text.parse::<f64>().is_ok() && !text.chars().all(|c| c.is_ascii_alphabetic());
    let ambiguous = text.contains(": ")
        || text.contains(" #")
        || text.ends_with(':')
        || text.trim() != text
        || text.contains(['\n', '\t']);
    if indicator || reserved || numeric || ambiguous {
        let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
        format!("\"{escaped}\"")
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests;
