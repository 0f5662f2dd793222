//! E2B template builds: a [`TemplateSpec`] says what goes into a template (a base image or
//! template, then COPY, RUN, ENV, WORKDIR and USER steps, a start and a ready command; or a
//! Dockerfile, converted as the SDK converts it), renders as the SDK's JSON or Dockerfile, and
//! [`Client::build_template`](crate::Client::build_template) sends it the way the official SDK
//! (`e2b` 2.63) does: it requests a build, uploads each COPY source as a gzip'd tar when E2B
//! does not already hold it, starts the build and follows it to the end, handing every build
//! log entry to the caller. Template names and tags are managed with
//! [`Client::assign_template_tags`](crate::Client::assign_template_tags) and its siblings.

mod answers;
mod dockerfile;
mod files;
mod options;
mod spec;
mod wire;

pub use self::answers::{
    BuildCache, BuildInfo, BuildLogEntry, BuildOptions, BuildReason, BuildState, BuildStatus,
    LogLevel, TagAssignment, TemplateTag,
};
pub(crate) use self::answers::{FilesLink, RequestedBuild};
pub(crate) use self::files::{CopyArchive, copy_hash, write_archive};
pub(crate) use self::options::CopyPlan;
pub use self::options::{
    AptOptions, CopyItem, CopyOptions, DependencyKind, Force, GitCloneOptions, MakeDirOptions,
    NodeScope, PipScope, Recommends, Recursion, RemoveOptions, RenameOptions, SymlinkMode,
    SymlinkOptions, UploadMode,
};
pub use self::spec::{ReadyCmd, RegistryCredentials, TemplateSpec};

#[cfg(test)]
pub(crate) mod tests;
