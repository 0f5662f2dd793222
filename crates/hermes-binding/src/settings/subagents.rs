//! The settings of delegated children (R15): where they work (`subagents`) and what becomes
//! of a child's fork once its work is back (`subagent_forks`).

/// Where a delegated child's tool calls run (`subagents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subagents {
    /// In the parent's sandbox, as Hermes does on every remote backend (`shared`).
    Shared,
    /// Each in a fork of the parent's sandbox, its work brought back (`fork`, R15).
    Fork,
}

impl Subagents {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Subagents::Shared => "shared",
            Subagents::Fork => "fork",
        }
    }

    /// Parses the setting's value.
    pub fn parse(value: &str) -> Option<Subagents> {
        match value {
            "shared" => Some(Subagents::Shared),
            "fork" => Some(Subagents::Fork),
            _ => None,
        }
    }
}

/// What becomes of a delegated child's fork once its work is back (`subagent_forks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubagentForks {
    /// Killed (`kill`).
    Kill,
    /// Paused and kept, a checkpoint of the child's sandbox (`keep`).
    Keep,
}

impl SubagentForks {
    /// The setting's value.
    pub fn as_str(self) -> &'static str {
        match self {
            SubagentForks::Kill => "kill",
            SubagentForks::Keep => "keep",
        }
    }

    /// Parses the setting's value.
    pub fn parse(value: &str) -> Option<SubagentForks> {
        match value {
            "kill" => Some(SubagentForks::Kill),
            "keep" => Some(SubagentForks::Keep),
            _ => None,
        }
    }
}
