//! The template definition and the steps its helpers emit, spelled exactly as the official
//! SDK spells them (`e2b` 2.63: paths through `shlex.quote`).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Operation};
use crate::secret::SecretValue;

/// The image `from_base_image` builds on (no tag, as the SDK sends it).
const BASE_IMAGE: &str = "e2bdev/base";

/// Whether a `-f` flag is given (`rm -f`, `mv … -f`, `ln -s -f`, a forced upload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Force {
    /// No `-f`.
    Off,
    /// With `-f`.
    On,
}

/// Whether `rm` removes directories with what is in them (`-r`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recursion {
    /// Plain `rm`.
    Single,
    /// `rm -r`.
    Recursive,
}

/// What a COPY does with the symbolic links among its sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymlinkMode {
    /// Links travel as links, with their raw targets (the SDK's default).
    Preserve,
    /// The file or directory a link points at travels in its place; a broken link fails the
    /// upload.
    Resolve,
}

/// When a COPY source is uploaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadMode {
    /// Only when E2B does not already hold files of the same hash (the SDK's default).
    WhenMissing,
    /// Every build, and the step's layer is rebuilt (`force_upload=True`).
    Always,
}

/// How a COPY step copies. Start from [`CopyOptions::new`].
#[derive(Clone, Debug)]
pub struct CopyOptions {
    /// The owner in the template, `user` or `user:group`; `None`: the current user.
    pub user: Option<String>,
    /// The permission bits the copied files get (`0o755`); `None` keeps theirs.
    pub mode: Option<u32>,
    /// What happens to symbolic links.
    pub symlinks: SymlinkMode,
    /// When the files are uploaded.
    pub upload: UploadMode,
}

impl CopyOptions {
    /// The SDK's defaults: current user, modes kept, links preserved, uploaded when missing.
    pub fn new() -> CopyOptions {
        CopyOptions {
            user: None,
            mode: None,
            symlinks: SymlinkMode::Preserve,
            upload: UploadMode::WhenMissing,
        }
    }
}

/// How [`TemplateSpec::remove`] runs `rm`. Start from [`RemoveOptions::new`].
#[derive(Clone, Debug)]
pub struct RemoveOptions {
    /// `-r`.
    pub recursion: Recursion,
    /// `-f`.
    pub force: Force,
    /// The user the command runs as; `None`: the current user.
    pub user: Option<String>,
}

impl RemoveOptions {
    /// Plain `rm` as the current user.
    pub fn new() -> RemoveOptions {
        RemoveOptions {
            recursion: Recursion::Single,
            force: Force::Off,
            user: None,
        }
    }
}

/// How [`TemplateSpec::rename`] runs `mv`. Start from [`RenameOptions::new`].
#[derive(Clone, Debug)]
pub struct RenameOptions {
    /// `-f`.
    pub force: Force,
    /// The user the command runs as; `None`: the current user.
    pub user: Option<String>,
}

impl RenameOptions {
    /// Plain `mv` as the current user.
    pub fn new() -> RenameOptions {
        RenameOptions {
            force: Force::Off,
            user: None,
        }
    }
}

/// How [`TemplateSpec::make_dir`] runs `mkdir -p`. Start from [`MakeDirOptions::new`].
#[derive(Clone, Debug)]
pub struct MakeDirOptions {
    /// `-m` with these permission bits; `None` (or 0, as the SDK reads it): no `-m`.
    pub mode: Option<u32>,
    /// The user the command runs as; `None`: the current user.
    pub user: Option<String>,
}

impl MakeDirOptions {
    /// `mkdir -p` as the current user.
    pub fn new() -> MakeDirOptions {
        MakeDirOptions {
            mode: None,
            user: None,
        }
    }
}

/// How [`TemplateSpec::make_symlink`] runs `ln -s`. Start from [`SymlinkOptions::new`].
#[derive(Clone, Debug)]
pub struct SymlinkOptions {
    /// `-f`: replace what is at the link's path.
    pub force: Force,
    /// The user the command runs as; `None`: the current user.
    pub user: Option<String>,
}

impl SymlinkOptions {
    /// Plain `ln -s` as the current user.
    pub fn new() -> SymlinkOptions {
        SymlinkOptions {
            force: Force::Off,
            user: None,
        }
    }
}

/// Where [`TemplateSpec::pip_install`] installs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipScope {
    /// System-wide, as root (the SDK's `g=True`, its default).
    Global,
    /// `pip install --user`, as the current user.
    User,
}

/// Whether apt installs recommended packages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recommends {
    /// apt's default.
    Install,
    /// `--no-install-recommends`.
    Skip,
}

/// How [`TemplateSpec::apt_install`] runs apt. Start from [`AptOptions::new`].
#[derive(Clone, Debug)]
pub struct AptOptions {
    /// Recommended packages.
    pub recommends: Recommends,
    /// `--fix-missing` when [`Force::On`].
    pub fix_missing: Force,
}

impl AptOptions {
    /// apt's defaults.
    pub fn new() -> AptOptions {
        AptOptions {
            recommends: Recommends::Install,
            fix_missing: Force::Off,
        }
    }
}

/// How [`TemplateSpec::git_clone`] clones. Start from [`GitCloneOptions::new`].
#[derive(Clone, Debug)]
pub struct GitCloneOptions {
    /// Where the clone goes; `None`: git's choice in the working directory.
    pub path: Option<String>,
    /// The one branch cloned (`--branch B --single-branch`); `None`: the default branch.
    pub branch: Option<String>,
    /// `--depth N`; `None`: the whole history.
    pub depth: Option<u32>,
    /// The user the command runs as; `None`: the current user.
    pub user: Option<String>,
}

impl GitCloneOptions {
    /// A full clone of the default branch, as the current user.
    pub fn new() -> GitCloneOptions {
        GitCloneOptions {
            path: None,
            branch: None,
            depth: None,
            user: None,
        }
    }
}

/// A template's ready command: E2B runs it every 2 s after the start command until it exits
/// 0. The helpers make the official SDK's exact commands.
///
/// ```
/// use e2b_client::template::ReadyCmd;
///
/// assert_eq!(ReadyCmd::wait_for_port(8000).as_str(), r#"[ -n "$(ss -Htuln sport = :8000)" ]"#);
/// assert_eq!(ReadyCmd::wait_for_file("/tmp/ready x").as_str(), "[ -f '/tmp/ready x' ]");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyCmd(String);

impl ReadyCmd {
    /// Any shell command.
    pub fn new(command: impl Into<String>) -> ReadyCmd {
        ReadyCmd(command.into())
    }

    /// Ready once something listens on `port`.
    pub fn wait_for_port(port: u16) -> ReadyCmd {
        ReadyCmd(format!("[ -n \"$(ss -Htuln sport = :{port})\" ]"))
    }

    /// Ready once `url` answers with HTTP `status`.
    pub fn wait_for_url(url: &str, status: u16) -> ReadyCmd {
        ReadyCmd(format!(
            "curl -s -o /dev/null -w \"%{{http_code}}\" {} | grep -q \"{status}\"",
            shell_quote(url)
        ))
    }

    /// Ready once a process of this name runs.
    pub fn wait_for_process(name: &str) -> ReadyCmd {
        ReadyCmd(format!("pgrep {} > /dev/null", shell_quote(name)))
    }

    /// Ready once the regular file `path` exists.
    pub fn wait_for_file(path: &str) -> ReadyCmd {
        ReadyCmd(format!("[ -f {} ]", shell_quote(path)))
    }

    /// Ready after `duration`, in whole seconds and at least one (`sleep N`).
    pub fn wait_for_timeout(duration: Duration) -> ReadyCmd {
        let secs = (duration.as_millis() / 1000).max(1);
        ReadyCmd(format!("sleep {secs}"))
    }

    /// The command.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for ReadyCmd {
    fn from(command: &str) -> ReadyCmd {
        ReadyCmd::new(command)
    }
}

impl From<String> for ReadyCmd {
    fn from(command: String) -> ReadyCmd {
        ReadyCmd(command)
    }
}

/// Python's `shlex.quote`: unchanged when only `[A-Za-z0-9_@%+=:,./-]`, else single-quoted
/// with each `'` as `'"'"'`; the empty string is `''`.
pub(crate) fn shell_quote(text: &str) -> String {
    if text.is_empty() {
        return "''".to_owned();
    }
    let safe = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    if safe {
        return text.to_owned();
    }
    format!("'{}'", text.replace('\'', "'\"'\"'"))
}

fn quoted<I, S>(paths: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    paths
        .into_iter()
        .map(|path| shell_quote(path.as_ref()))
        .collect()
}

/// How E2B logs in to the registry a private base image comes from
/// ([`TemplateSpec::from_private_image`]). The secrets are [`SecretValue`]s: never in a
/// `Debug` output or an error's text.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RegistryCredentials {
    /// A user name and password (the SDK's `from_image(image, username, password)`).
    Basic {
        /// The registry user.
        username: String,
        /// Its password or token.
        password: SecretValue,
    },
    /// Amazon ECR (the SDK's `from_aws_registry`).
    Aws {
        /// The access key id.
        access_key_id: String,
        /// The secret access key.
        secret_access_key: SecretValue,
        /// The registry's region (`us-east-1`).
        region: String,
    },
    /// Google Artifact Registry or GCR (the SDK's `from_gcp_registry`).
    Gcp {
        /// The service account's JSON key, its content (not a path).
        service_account_json: SecretValue,
    },
}

impl RegistryCredentials {
    fn secrets(&self) -> Vec<SecretValue> {
        match self {
            RegistryCredentials::Basic { password, .. } => vec![password.clone()],
            RegistryCredentials::Aws {
                secret_access_key, ..
            } => vec![secret_access_key.clone()],
            RegistryCredentials::Gcp {
                service_account_json,
            } => vec![service_account_json.clone()],
        }
    }

    fn wire(&self) -> RegistryWire<'_> {
        match self {
            RegistryCredentials::Basic { username, password } => RegistryWire::Basic {
                username,
                password: password.expose(),
            },
            RegistryCredentials::Aws {
                access_key_id,
                secret_access_key,
                region,
            } => RegistryWire::Aws {
                access_key_id,
                secret_access_key: secret_access_key.expose(),
                region,
            },
            RegistryCredentials::Gcp {
                service_account_json,
            } => RegistryWire::Gcp {
                service_account_json: service_account_json.expose(),
            },
        }
    }
}

/// `fromImageRegistry`, as the SDK writes it.
#[derive(Serialize)]
#[serde(tag = "type")]
enum RegistryWire<'a> {
    #[serde(rename = "registry")]
    Basic {
        username: &'a str,
        password: &'a str,
    },
    #[serde(rename = "aws")]
    Aws {
        #[serde(rename = "awsAccessKeyId")]
        access_key_id: &'a str,
        #[serde(rename = "awsSecretAccessKey")]
        secret_access_key: &'a str,
        #[serde(rename = "awsRegion")]
        region: &'a str,
    },
    #[serde(rename = "gcp")]
    Gcp {
        #[serde(rename = "serviceAccountJson")]
        service_account_json: &'a str,
    },
}

/// Where [`TemplateSpec::npm_install`] and [`TemplateSpec::bun_install`] install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeScope {
    /// Into the working directory's project, as the current user (the SDK's default).
    Project,
    /// `-g`, system-wide, as root (the SDK's `g=True`).
    Global,
}

/// Which dependencies a Node package install records the packages as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DependencyKind {
    /// Ordinary dependencies (the SDK's default).
    Regular,
    /// Development dependencies (`--save-dev` for npm, `--dev` for bun; the SDK's
    /// `dev=True`).
    Development,
}

/// What the template starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Base {
    Image(String),
    Template(String),
}

/// A COPY step's source, as the build needs it to hash and pack it.
#[derive(Clone, Debug)]
pub(crate) struct CopyPlan {
    pub(crate) src: String,
    pub(crate) dest: String,
    pub(crate) symlinks: SymlinkMode,
    pub(crate) upload: UploadMode,
    /// The spec's ignore patterns (those of `.dockerignore` are read at build time).
    pub(crate) ignore: Vec<String>,
}

#[derive(Clone, Debug)]
struct Step {
    kind: &'static str,
    args: Vec<String>,
    force: bool,
    copy: Option<CopyPlan>,
}

/// What goes into a template: a base, then steps in order, then the start and ready
/// commands. Each method returns the spec, so calls chain; only [`TemplateSpec::copy`] can
/// fail (a source outside the file context).
///
/// ```
/// use e2b_client::template::{CopyOptions, ReadyCmd, TemplateSpec};
///
/// # fn demo() -> Result<(), e2b_client::Error> {
/// let spec = TemplateSpec::from_base_image()
///     .with_file_context("./docker")
///     .copy("app.py", "/app/", &CopyOptions::new())?
///     .pip_install(["flask"], e2b_client::template::PipScope::Global)
///     .set_workdir("/app")
///     .set_start_cmd("python app.py", ReadyCmd::wait_for_port(8000));
/// # let _ = spec;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TemplateSpec {
    base: Base,
    context: Option<PathBuf>,
    ignore: Vec<String>,
    steps: Vec<Step>,
    /// Set by [`TemplateSpec::skip_cache`]: every later step is forced.
    force_next: bool,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    /// How E2B logs in to the base image's registry.
    registry: Option<RegistryCredentials>,
}

impl TemplateSpec {
    fn with_base(base: Base) -> TemplateSpec {
        TemplateSpec {
            base,
            context: None,
            ignore: Vec::new(),
            steps: Vec::new(),
            force_next: false,
            start_cmd: None,
            ready_cmd: None,
            registry: None,
        }
    }

    /// A template built on a container image (`ubuntu:24.04`, `python:3`), pulled by E2B.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_image("python:3.12-slim");
    /// # let _ = spec;
    /// ```
    pub fn from_image(image: impl Into<String>) -> TemplateSpec {
        TemplateSpec::with_base(Base::Image(image.into()))
    }

    /// A template built on E2B's base image, `e2bdev/base`.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image().run_cmd("whoami");
    /// # let _ = spec;
    /// ```
    pub fn from_base_image() -> TemplateSpec {
        TemplateSpec::from_image(BASE_IMAGE)
    }

    /// A template built on a private image, pulled by E2B with `credentials` (the SDK's
    /// `from_image` with a user name and password, `from_aws_registry` and
    /// `from_gcp_registry`).
    ///
    /// ```
    /// use e2b_client::SecretValue;
    /// use e2b_client::template::{RegistryCredentials, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_private_image(
    ///     "123456789.dkr.ecr.us-east-1.amazonaws.com/app:1",
    ///     RegistryCredentials::Aws {
    ///         access_key_id: "AKIA…".to_owned(),
    ///         secret_access_key: SecretValue::new("…".to_owned()),
    ///         region: "us-east-1".to_owned(),
    ///     },
    /// );
    /// # let _ = spec;
    /// ```
    pub fn from_private_image(
        image: impl Into<String>,
        credentials: RegistryCredentials,
    ) -> TemplateSpec {
        let mut spec = TemplateSpec::from_image(image);
        spec.registry = Some(credentials);
        spec
    }

    /// `debian:<variant>` (the SDK's `from_debian_image`; its default variant is `stable`).
    pub fn from_debian_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("debian:{variant}"))
    }

    /// `ubuntu:<variant>` (the SDK's `from_ubuntu_image`; default `latest`).
    pub fn from_ubuntu_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("ubuntu:{variant}"))
    }

    /// `fedora:<variant>` (the SDK's `from_fedora_image`; default `44`).
    pub fn from_fedora_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("fedora:{variant}"))
    }

    /// `alpine:<variant>` (the SDK's `from_alpine_image`; default `3.24`).
    pub fn from_alpine_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("alpine:{variant}"))
    }

    /// `archlinux:<variant>` (the SDK's `from_arch_image`; default `latest`).
    pub fn from_arch_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("archlinux:{variant}"))
    }

    /// `python:<version>` (the SDK's `from_python_image`; default `3`).
    pub fn from_python_image(version: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("python:{version}"))
    }

    /// `node:<variant>` (the SDK's `from_node_image`; default `lts`).
    pub fn from_node_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("node:{variant}"))
    }

    /// `oven/bun:<variant>` (the SDK's `from_bun_image`; default `latest`).
    pub fn from_bun_image(variant: &str) -> TemplateSpec {
        TemplateSpec::from_image(format!("oven/bun:{variant}"))
    }

    /// A template built on another template, `name[:tag]` or an id: its files, env, user,
    /// working directory and start command are inherited.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_template("my-base:v2");
    /// # let _ = spec;
    /// ```
    pub fn from_template(template: impl Into<String>) -> TemplateSpec {
        TemplateSpec::with_base(Base::Template(template.into()))
    }

    /// The local directory COPY sources are relative to; without one, the process's current
    /// directory at build time.
    pub fn with_file_context(mut self, dir: impl Into<PathBuf>) -> TemplateSpec {
        self.context = Some(dir.into());
        self
    }

    /// Files of the context no COPY takes, in `.dockerignore` syntax (`node_modules`,
    /// `**/*.pyc`, `!keep.pyc`), after the lines of the context's own `.dockerignore`: the
    /// last pattern that matches a path, or a directory above it, decides.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image()
    ///     .with_ignore_patterns(["**/__pycache__", "*.log", "!keep.log"]);
    /// # let _ = spec;
    /// ```
    pub fn with_ignore_patterns<I, S>(mut self, patterns: I) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.ignore.extend(patterns.into_iter().map(Into::into));
        self
    }

    /// The file context directory, if one was set.
    pub fn file_context(&self) -> Option<&Path> {
        self.context.as_deref()
    }

    fn push(mut self, kind: &'static str, args: Vec<String>) -> TemplateSpec {
        let force = self.force_next;
        self.steps.push(Step {
            kind,
            args,
            force,
            copy: None,
        });
        self
    }

    /// Copies `src`, a path or glob relative to the file context (`app.py`, `src/**/*.py`,
    /// `folder/*`), to `dest` in the template; a directory travels with everything in it. An
    /// absolute `src`, or one that leaves the file context (`../x`), is refused
    /// ([`Error::is_invalid_request`]). The files are read when the build runs.
    ///
    /// ```
    /// use e2b_client::template::{CopyOptions, SymlinkMode, TemplateSpec};
    ///
    /// let mut options = CopyOptions::new();
    /// options.mode = Some(0o755);
    /// options.symlinks = SymlinkMode::Resolve;
    /// let spec = TemplateSpec::from_base_image().copy("bin/tool", "/usr/local/bin/", &options);
    /// assert!(spec.is_ok());
    /// assert!(TemplateSpec::from_base_image().copy("/etc/passwd", "/x", &options).is_err());
    /// ```
    pub fn copy(
        mut self,
        src: &str,
        dest: &str,
        options: &CopyOptions,
    ) -> Result<TemplateSpec, Error> {
        check_source(src).map_err(|reason| Error::InvalidInput {
            operation: Operation::BuildTemplate,
            sandbox_id: None,
            reason,
        })?;
        let args = vec![
            src.to_owned(),
            dest.to_owned(),
            options.user.clone().unwrap_or_default(),
            options
                .mode
                .map(|mode| format!("{mode:04o}"))
                .unwrap_or_default(),
        ];
        let force = options.upload == UploadMode::Always || self.force_next;
        self.steps.push(Step {
            kind: "COPY",
            args,
            force,
            copy: Some(CopyPlan {
                src: src.to_owned(),
                dest: dest.to_owned(),
                symlinks: options.symlinks,
                upload: options.upload,
                ignore: Vec::new(),
            }),
        });
        Ok(self)
    }

    /// Runs a shell command as the current user (a RUN step).
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image().run_cmd("make -C /src");
    /// # let _ = spec;
    /// ```
    pub fn run_cmd(self, command: impl Into<String>) -> TemplateSpec {
        self.push("RUN", vec![command.into()])
    }

    /// Runs a shell command as `user` (a RUN step; the user does not persist).
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image()
    ///     .run_cmd_as("apt-get update", "root");
    /// # let _ = spec;
    /// ```
    pub fn run_cmd_as(self, command: impl Into<String>, user: impl Into<String>) -> TemplateSpec {
        let user = user.into();
        let mut args = vec![command.into()];
        if !user.is_empty() {
            args.push(user);
        }
        self.push("RUN", args)
    }

    fn run_maybe_as(self, command: String, user: Option<String>) -> TemplateSpec {
        match user {
            Some(user) => self.run_cmd_as(command, user),
            None => self.run_cmd(command),
        }
    }

    /// Sets environment variables for the later build steps (an ENV step, in the given
    /// order; none: no step). Values are expanded in the template at build time.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image()
    ///     .set_envs([("PORT", "8000"), ("MODE", "prod")]);
    /// # let _ = spec;
    /// ```
    pub fn set_envs<I, K, V>(self, envs: I) -> TemplateSpec
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let args: Vec<String> = envs
            .into_iter()
            .flat_map(|(key, value)| [key.into(), value.into()])
            .collect();
        if args.is_empty() {
            return self;
        }
        self.push("ENV", args)
    }

    /// Sets the working directory of the later steps and of the template's sandboxes (a
    /// WORKDIR step; made if missing).
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image().set_workdir("/app");
    /// # let _ = spec;
    /// ```
    pub fn set_workdir(self, workdir: impl Into<String>) -> TemplateSpec {
        self.push("WORKDIR", vec![workdir.into()])
    }

    /// Sets the user of the later steps and of the template's sandboxes (a USER step; made
    /// if missing).
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image().set_user("root");
    /// # let _ = spec;
    /// ```
    pub fn set_user(self, user: impl Into<String>) -> TemplateSpec {
        self.push("USER", vec![user.into()])
    }

    /// Makes directories with their parents (`mkdir -p [-m MODE] PATHS`).
    ///
    /// ```
    /// use e2b_client::template::{MakeDirOptions, TemplateSpec};
    ///
    /// let mut options = MakeDirOptions::new();
    /// options.mode = Some(0o700);
    /// let spec = TemplateSpec::from_base_image().make_dir(["/data", "/logs"], options);
    /// # let _ = spec;
    /// ```
    pub fn make_dir<I, S>(self, paths: I, options: MakeDirOptions) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut args = vec!["mkdir".to_owned(), "-p".to_owned()];
        if let Some(mode) = options.mode.filter(|mode| *mode != 0) {
            args.push(format!("-m {mode:04o}"));
        }
        args.extend(quoted(paths));
        self.run_maybe_as(args.join(" "), options.user)
    }

    /// Makes a symbolic link at `link` pointing at `target` (`ln -s [-f] TARGET LINK`).
    ///
    /// ```
    /// use e2b_client::template::{SymlinkOptions, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image()
    ///     .make_symlink("/usr/bin/python3", "/usr/bin/python", SymlinkOptions::new());
    /// # let _ = spec;
    /// ```
    pub fn make_symlink(self, target: &str, link: &str, options: SymlinkOptions) -> TemplateSpec {
        let mut args = vec!["ln".to_owned(), "-s".to_owned()];
        if options.force == Force::On {
            args.push("-f".to_owned());
        }
        args.push(shell_quote(target));
        args.push(shell_quote(link));
        self.run_maybe_as(args.join(" "), options.user)
    }

    /// Removes paths (`rm [-r] [-f] PATHS`).
    ///
    /// ```
    /// use e2b_client::template::{Force, Recursion, RemoveOptions, TemplateSpec};
    ///
    /// let mut options = RemoveOptions::new();
    /// options.recursion = Recursion::Recursive;
    /// options.force = Force::On;
    /// let spec = TemplateSpec::from_base_image().remove(["/tmp/cache"], options);
    /// # let _ = spec;
    /// ```
    pub fn remove<I, S>(self, paths: I, options: RemoveOptions) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut args = vec!["rm".to_owned()];
        if options.recursion == Recursion::Recursive {
            args.push("-r".to_owned());
        }
        if options.force == Force::On {
            args.push("-f".to_owned());
        }
        args.extend(quoted(paths));
        self.run_maybe_as(args.join(" "), options.user)
    }

    /// Renames or moves a path (`mv SRC DEST [-f]`).
    ///
    /// ```
    /// use e2b_client::template::{RenameOptions, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image().rename("/tmp/a", "/tmp/b", RenameOptions::new());
    /// # let _ = spec;
    /// ```
    pub fn rename(self, src: &str, dest: &str, options: RenameOptions) -> TemplateSpec {
        let mut args = vec!["mv".to_owned(), shell_quote(src), shell_quote(dest)];
        if options.force == Force::On {
            args.push("-f".to_owned());
        }
        self.run_maybe_as(args.join(" "), options.user)
    }

    /// Installs Python packages with pip (`pip install [--user] PKGS`, system-wide as root
    /// for [`PipScope::Global`]); no packages: `pip install .` (the working directory).
    ///
    /// ```
    /// use e2b_client::template::{PipScope, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image().pip_install(["numpy", "pandas"], PipScope::Global);
    /// # let _ = spec;
    /// ```
    pub fn pip_install<I, S>(self, packages: I, scope: PipScope) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut args = vec!["pip".to_owned(), "install".to_owned()];
        if scope == PipScope::User {
            args.push("--user".to_owned());
        }
        let packages: Vec<String> = packages.into_iter().map(Into::into).collect();
        if packages.is_empty() {
            args.push(".".to_owned());
        } else {
            args.extend(packages);
        }
        let user = (scope == PipScope::Global).then(|| "root".to_owned());
        self.run_maybe_as(args.join(" "), user)
    }

    /// Installs Node packages with npm (`npm install [-g] [--save-dev] PKGS`, as root for
    /// [`NodeScope::Global`]); no packages: the project's own (`npm install`).
    ///
    /// ```
    /// use e2b_client::template::{DependencyKind, NodeScope, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_node_image("lts")
    ///     .npm_install(["typescript"], NodeScope::Global, DependencyKind::Regular);
    /// # let _ = spec;
    /// ```
    pub fn npm_install<I, S>(
        self,
        packages: I,
        scope: NodeScope,
        kind: DependencyKind,
    ) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.node_install("npm", "--save-dev", packages, scope, kind)
    }

    /// Installs packages with bun (`bun install [-g] [--dev] PKGS`, as root for
    /// [`NodeScope::Global`]); no packages: the project's own (`bun install`).
    pub fn bun_install<I, S>(
        self,
        packages: I,
        scope: NodeScope,
        kind: DependencyKind,
    ) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.node_install("bun", "--dev", packages, scope, kind)
    }

    fn node_install<I, S>(
        self,
        tool: &str,
        dev_flag: &str,
        packages: I,
        scope: NodeScope,
        kind: DependencyKind,
    ) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut args = vec![tool.to_owned(), "install".to_owned()];
        if scope == NodeScope::Global {
            args.push("-g".to_owned());
        }
        if kind == DependencyKind::Development {
            args.push(dev_flag.to_owned());
        }
        args.extend(packages.into_iter().map(Into::into));
        let user = (scope == NodeScope::Global).then(|| "root".to_owned());
        self.run_maybe_as(args.join(" "), user)
    }

    /// Installs Debian packages as root (`apt-get update && … apt-get install -y … PKGS`).
    ///
    /// ```
    /// use e2b_client::template::{AptOptions, Recommends, TemplateSpec};
    ///
    /// let mut options = AptOptions::new();
    /// options.recommends = Recommends::Skip;
    /// let spec = TemplateSpec::from_base_image().apt_install(["git", "curl"], options);
    /// # let _ = spec;
    /// ```
    pub fn apt_install<I, S>(self, packages: I, options: AptOptions) -> TemplateSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut install = vec![
            "DEBIAN_FRONTEND=noninteractive".to_owned(),
            "DEBCONF_NOWARNINGS=yes".to_owned(),
            "apt-get".to_owned(),
            "install".to_owned(),
            "-y".to_owned(),
        ];
        if options.recommends == Recommends::Skip {
            install.push("--no-install-recommends".to_owned());
        }
        if options.fix_missing == Force::On {
            install.push("--fix-missing".to_owned());
        }
        install.extend(packages.into_iter().map(Into::into));
        let command = format!("apt-get update && {}", install.join(" "));
        self.run_cmd_as(command, "root")
    }

    /// Clones a git repository (`git clone URL [--branch B --single-branch] [--depth N]
    /// [PATH]`).
    ///
    /// ```
    /// use e2b_client::template::{GitCloneOptions, TemplateSpec};
    ///
    /// let mut options = GitCloneOptions::new();
    /// options.branch = Some("main".to_owned());
    /// options.depth = Some(1);
    /// options.path = Some("/src/app".to_owned());
    /// let spec = TemplateSpec::from_base_image()
    ///     .git_clone("https://github.com/e2b-dev/e2b.git", options);
    /// # let _ = spec;
    /// ```
    pub fn git_clone(self, url: &str, options: GitCloneOptions) -> TemplateSpec {
        let mut args = vec!["git".to_owned(), "clone".to_owned(), shell_quote(url)];
        if let Some(branch) = &options.branch {
            args.push(format!("--branch {}", shell_quote(branch)));
            args.push("--single-branch".to_owned());
        }
        if let Some(depth) = options.depth {
            args.push(format!("--depth {depth}"));
        }
        if let Some(path) = &options.path {
            args.push(shell_quote(path));
        }
        self.run_maybe_as(args.join(" "), options.user)
    }

    /// Rebuilds every later step instead of reusing E2B's cached layers (no step of its
    /// own). To rebuild everything, base included, use
    /// [`BuildCache::Skip`](super::BuildCache::Skip) on the build.
    ///
    /// ```
    /// let spec = e2b_client::template::TemplateSpec::from_base_image()
    ///     .run_cmd("echo cached")
    ///     .skip_cache()
    ///     .run_cmd("echo rebuilt every time");
    /// # let _ = spec;
    /// ```
    pub fn skip_cache(mut self) -> TemplateSpec {
        self.force_next = true;
        self
    }

    /// The command the template's sandboxes start with, and the command that tells it is
    /// ready (both run at build time; sandboxes resume with the process already running).
    ///
    /// ```
    /// use e2b_client::template::{ReadyCmd, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image()
    ///     .set_start_cmd("python -m http.server 8000", ReadyCmd::wait_for_port(8000));
    /// # let _ = spec;
    /// ```
    pub fn set_start_cmd(
        mut self,
        start: impl Into<String>,
        ready: impl Into<ReadyCmd>,
    ) -> TemplateSpec {
        self.start_cmd = Some(start.into());
        self.ready_cmd = Some(ready.into().0);
        self
    }

    /// Only the ready command (the start command, if any, is inherited or unset).
    ///
    /// ```
    /// use std::time::Duration;
    /// use e2b_client::template::{ReadyCmd, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_template("web")
    ///     .set_ready_cmd(ReadyCmd::wait_for_timeout(Duration::from_secs(10)));
    /// # let _ = spec;
    /// ```
    pub fn set_ready_cmd(mut self, ready: impl Into<ReadyCmd>) -> TemplateSpec {
        self.ready_cmd = Some(ready.into().0);
        self
    }

    /// The COPY steps, in order, with their indices among all steps and the spec's ignore
    /// patterns.
    pub(crate) fn copies(&self) -> Vec<(usize, CopyPlan)> {
        self.steps
            .iter()
            .enumerate()
            .filter_map(|(index, step)| {
                let mut plan = step.copy.clone()?;
                plan.ignore.clone_from(&self.ignore);
                Some((index, plan))
            })
            .collect()
    }

    /// The registry secrets the start-build body carries, for the errors to scrub.
    pub(crate) fn registry_secrets(&self) -> Vec<SecretValue> {
        self.registry
            .as_ref()
            .map(RegistryCredentials::secrets)
            .unwrap_or_default()
    }

    /// The start-build body, `hashes[i]` being step `i`'s files hash (COPY steps only).
    pub(crate) fn start_body<'a>(
        &'a self,
        hashes: &'a [Option<String>],
        force: bool,
    ) -> StartBody<'a> {
        let (from_image, from_template) = match &self.base {
            Base::Image(image) => (Some(image.as_str()), None),
            Base::Template(template) => (None, Some(template.as_str())),
        };
        StartBody {
            from_image,
            from_template,
            from_image_registry: self
                .registry
                .as_ref()
                .filter(|_| from_image.is_some())
                .map(RegistryCredentials::wire),
            force,
            steps: self
                .steps
                .iter()
                .enumerate()
                .map(|(index, step)| StepWire {
                    kind: step.kind,
                    args: &step.args,
                    files_hash: hashes.get(index).and_then(Option::as_deref),
                    force: step.force,
                    force_upload: step
                        .copy
                        .as_ref()
                        .is_some_and(|plan| plan.upload == UploadMode::Always)
                        .then_some(true),
                })
                .collect(),
            start_cmd: self.start_cmd.as_deref(),
            ready_cmd: self.ready_cmd.as_deref(),
        }
    }
}

/// `TemplateBuildStartV2`, in the order the SDK writes it.
#[derive(Serialize)]
pub(crate) struct StartBody<'a> {
    #[serde(rename = "fromImage", skip_serializing_if = "Option::is_none")]
    from_image: Option<&'a str>,
    #[serde(rename = "fromTemplate", skip_serializing_if = "Option::is_none")]
    from_template: Option<&'a str>,
    #[serde(rename = "fromImageRegistry", skip_serializing_if = "Option::is_none")]
    from_image_registry: Option<RegistryWire<'a>>,
    force: bool,
    steps: Vec<StepWire<'a>>,
    #[serde(rename = "startCmd", skip_serializing_if = "Option::is_none")]
    start_cmd: Option<&'a str>,
    #[serde(rename = "readyCmd", skip_serializing_if = "Option::is_none")]
    ready_cmd: Option<&'a str>,
}

#[derive(Serialize)]
struct StepWire<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    args: &'a [String],
    #[serde(rename = "filesHash", skip_serializing_if = "Option::is_none")]
    files_hash: Option<&'a str>,
    force: bool,
    #[serde(rename = "forceUpload", skip_serializing_if = "Option::is_none")]
    force_upload: Option<bool>,
}

/// A COPY source must be relative and stay inside the file context (checked on the text,
/// as the SDK does at `.copy()` time).
fn check_source(src: &str) -> Result<(), String> {
    if src.is_empty() {
        return Err("the COPY source is empty".to_owned());
    }
    let path = Path::new(src);
    if path.is_absolute() || src.starts_with('/') {
        return Err(format!(
            "Invalid source path \"{src}\": absolute paths are not allowed; use a path relative \
             to the file context directory"
        ));
    }
    let mut depth: usize = 0;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!(
                        "Invalid source path \"{src}\": path escapes the context directory; it \
                         must stay inside it"
                    )
                })?;
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "Invalid source path \"{src}\": absolute paths are not allowed"
                ));
            }
        }
    }
    Ok(())
}

/// `Default` is `new()` for the option structs that need no argument, as elsewhere in the
/// crate (`CloneOptions`).
macro_rules! default_is_new {
    ($($name:ident),*) => {$(
        impl Default for $name {
            fn default() -> $name {
                $name::new()
            }
        }
    )*};
}

default_is_new!(
    CopyOptions,
    RemoveOptions,
    RenameOptions,
    MakeDirOptions,
    SymlinkOptions,
    AptOptions,
    GitCloneOptions
);
