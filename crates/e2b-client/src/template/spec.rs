//! The template definition and the steps its helpers emit, spelled exactly as the official
//! SDK spells them (`e2b` 2.63: paths through `shlex.quote`).

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Operation};
use crate::secret::SecretValue;

use super::dockerfile::{self, DockerfileError, shell_quote};
use super::files::copy_hash;
use super::options::{
    AptOptions, CopyItem, CopyOptions, CopyPlan, DependencyKind, Force, GitCloneOptions,
    MakeDirOptions, NodeScope, PipScope, Recommends, Recursion, RemoveOptions, RenameOptions,
    SymlinkOptions, UploadMode,
};
use super::wire::{RegistryWire, StartBody, StepWire};

/// The image `from_base_image` builds on (no tag, as the SDK sends it).
const BASE_IMAGE: &str = "e2bdev/base";

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

/// What the template starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Base {
    Image(String),
    Template(String),
}

#[derive(Clone, Debug)]
struct Step {
    kind: &'static str,
    args: Vec<String>,
    force: bool,
    copy: Option<CopyPlan>,
}

/// What goes into a template: a base, then steps in order, then the start and ready
/// commands. Each method returns the spec, so calls chain; those that can refuse their input
/// return it in a `Result`: [`TemplateSpec::copy`] and [`TemplateSpec::copy_items`] (a source
/// outside the file context), [`TemplateSpec::from_dockerfile`], and the helpers that need one
/// of E2B's own templates as the base ([`TemplateSpec::add_mcp_server`] and the dev container
/// ones). [`TemplateSpec::to_json`] and [`TemplateSpec::to_dockerfile`] write it as the SDK
/// does.
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

    /// A template made from a Dockerfile's text, as the SDK's `from_dockerfile` makes it: the
    /// FROM image is the base, and the steps run as `root` in `/` (Docker's defaults) unless
    /// the Dockerfile says otherwise, then end with `USER user` and `WORKDIR /home/user`
    /// (E2B's defaults) for what the Dockerfile left unset.
    ///
    /// RUN (shell, exec and heredoc forms), COPY and ADD (local sources relative to the file
    /// context, `--chown`, `--chmod`, heredoc sources written by a RUN as root), WORKDIR,
    /// USER, ENV (`ENV a=b c=d` and `ENV a b`) and ARG (an ENV step with its default) become
    /// steps; CMD and ENTRYPOINT combine into the start command as Docker combines them,
    /// ready after 20 s. `$VAR` references stay for the build's shell to expand. Line
    /// continuations, comments, quotes and the `# escape=` directive are read as BuildKit
    /// reads them. EXPOSE, VOLUME, LABEL and MAINTAINER are dropped; HEALTHCHECK, ONBUILD,
    /// SHELL, STOPSIGNAL and flags a template cannot honour (`RUN --mount`, `COPY --link`,
    /// …) are dropped with a `tracing` warning.
    ///
    /// Refused ([`Error::is_invalid_request`], [`Operation::ParseDockerfile`], the reason
    /// naming the line): a second FROM (multi-stage builds), `COPY --from`, ADD of a URL, a
    /// COPY source outside the file context, an unknown instruction or flag, and malformed
    /// text (an unclosed quote or heredoc, a bad `${…}`).
    ///
    /// ```
    /// use e2b_client::template::TemplateSpec;
    ///
    /// let spec = TemplateSpec::from_dockerfile(
    ///     r#"
    /// FROM python:3.12-slim
    /// ## Line continuations and comments read as Docker reads them.
    /// RUN pip install flask \
    ///     gunicorn
    /// WORKDIR /app
    /// CMD ["gunicorn", "app:app"]
    /// "#,
    /// )?;
    /// assert!(spec.to_dockerfile()?.starts_with("FROM python:3.12-slim\n"));
    /// assert!(TemplateSpec::from_dockerfile("FROM a\nFROM b\n").is_err());
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn from_dockerfile(content: &str) -> Result<TemplateSpec, Error> {
        let refuse = |error: DockerfileError| Error::InvalidInput {
            operation: Operation::ParseDockerfile,
            sandbox_id: None,
            reason: error.to_string(),
        };
        let converted = dockerfile::convert(content).map_err(refuse)?;
        for warning in &converted.warnings {
            tracing::warn!(%warning, "Dockerfile instruction left out of the template");
        }
        let mut spec = TemplateSpec::from_image(converted.base_image);
        for step in converted.steps {
            spec = match step {
                dockerfile::Step::Run { command, user } => spec.run_maybe_as(command, user),
                dockerfile::Step::Copy {
                    src,
                    dest,
                    user,
                    mode,
                    line,
                } => {
                    check_source(&src).map_err(|reason| {
                        refuse(DockerfileError {
                            line: Some(line),
                            reason,
                        })
                    })?;
                    let mut options = CopyOptions::new();
                    options.user = user;
                    options.mode = mode;
                    spec.copy(&src, &dest, &options)?
                }
                dockerfile::Step::Workdir(workdir) => spec.set_workdir(workdir),
                dockerfile::Step::User(user) => spec.set_user(user),
                dockerfile::Step::Env(envs) => spec.set_envs(envs),
            };
        }
        if let Some(start) = converted.start_cmd {
            spec = spec.set_start_cmd(start, ReadyCmd::wait_for_timeout(Duration::from_secs(20)));
        }
        Ok(spec)
    }

    /// [`TemplateSpec::from_dockerfile`] of the file at `path` (UTF-8). COPY sources stay
    /// relative to the file context ([`TemplateSpec::with_file_context`]), not to the
    /// Dockerfile's directory, as in the SDK. A file that cannot be read is
    /// [`Error::is_invalid_request`] too.
    ///
    /// ```no_run
    /// use e2b_client::template::TemplateSpec;
    ///
    /// let spec = TemplateSpec::from_dockerfile_path("docker/Dockerfile")?
    ///     .with_file_context("docker");
    /// # let _ = spec;
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn from_dockerfile_path(path: impl AsRef<Path>) -> Result<TemplateSpec, Error> {
        let path = path.as_ref();
        let content = std::fs::read_to_string(path).map_err(|error| Error::InvalidInput {
            operation: Operation::ParseDockerfile,
            sandbox_id: None,
            reason: format!("cannot read the Dockerfile {}: {error}", path.display()),
        })?;
        TemplateSpec::from_dockerfile(&content)
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

    /// Copies several sources, each as [`TemplateSpec::copy`] would (the SDK's `copy_items`);
    /// the first invalid source refuses the whole list.
    ///
    /// ```
    /// use e2b_client::template::{CopyItem, TemplateSpec};
    ///
    /// let mut config = CopyItem::new("config.toml", "/app/");
    /// config.options.mode = Some(0o600);
    /// let spec = TemplateSpec::from_base_image()
    ///     .copy_items([CopyItem::new("app.py", "/app/"), config])?;
    /// # let _ = spec;
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn copy_items<I>(self, items: I) -> Result<TemplateSpec, Error>
    where
        I: IntoIterator<Item = CopyItem>,
    {
        items.into_iter().try_fold(self, |spec, item| {
            spec.copy(&item.src, &item.dest, &item.options)
        })
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
        if let Some(mode) = options.mode {
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

    /// Installs MCP servers into a template built on E2B's `mcp-gateway` template
    /// (`mcp-gateway pull SERVERS` as root; names as given, unquoted, as the SDK sends them).
    /// On any other base it is refused ([`Error::is_invalid_request`]): only that template
    /// has the gateway.
    ///
    /// ```
    /// use e2b_client::template::TemplateSpec;
    ///
    /// let spec = TemplateSpec::from_template("mcp-gateway").add_mcp_server(["brave", "exa"])?;
    /// # let _ = spec;
    /// assert!(TemplateSpec::from_base_image().add_mcp_server(["exa"]).is_err());
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn add_mcp_server<I, S>(self, servers: I) -> Result<TemplateSpec, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.require_base_template("mcp-gateway", "MCP servers")?;
        let servers: Vec<String> = servers.into_iter().map(Into::into).collect();
        Ok(self.run_cmd_as(format!("mcp-gateway pull {}", servers.join(" ")), "root"))
    }

    /// Builds the dev container of `dir` (a directory in the template holding a
    /// `.devcontainer`) at template build time, so that sandboxes start it faster
    /// (`devcontainer build --workspace-folder DIR` as root; the SDK's beta
    /// `beta_dev_container_prebuild`). Only on E2B's `devcontainer` template; elsewhere it
    /// is refused ([`Error::is_invalid_request`]).
    ///
    /// ```
    /// use e2b_client::template::{GitCloneOptions, TemplateSpec};
    ///
    /// let mut clone = GitCloneOptions::new();
    /// clone.path = Some("/project".to_owned());
    /// let spec = TemplateSpec::from_template("devcontainer")
    ///     .git_clone("https://github.com/example/project.git", clone)
    ///     .beta_dev_container_prebuild("/project")?
    ///     .beta_set_dev_container_start("/project")?;
    /// # let _ = spec;
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn beta_dev_container_prebuild(self, dir: &str) -> Result<TemplateSpec, Error> {
        self.require_base_template("devcontainer", "dev containers")?;
        let command = format!("devcontainer build --workspace-folder {}", shell_quote(dir));
        Ok(self.run_cmd_as(command, "root"))
    }

    /// Makes the dev container of `dir` the sandboxes' start command: `devcontainer up`,
    /// then `/devcontainer.sh` written to run commands inside it, ready once
    /// `/devcontainer.up` exists (the SDK's beta `beta_set_dev_container_start`). Only on
    /// E2B's `devcontainer` template; elsewhere it is refused ([`Error::is_invalid_request`]).
    ///
    /// ```
    /// use e2b_client::template::TemplateSpec;
    ///
    /// let spec = TemplateSpec::from_template("devcontainer")
    ///     .beta_set_dev_container_start("/project")?;
    /// # let _ = spec;
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn beta_set_dev_container_start(self, dir: &str) -> Result<TemplateSpec, Error> {
        self.require_base_template("devcontainer", "dev containers")?;
        let dir = shell_quote(dir);
        let start = format!(
            "sudo devcontainer up --workspace-folder {dir} && sudo /prepare-exec.sh {dir} | \
             sudo tee /devcontainer.sh > /dev/null && sudo chmod +x /devcontainer.sh && \
             sudo touch /devcontainer.up"
        );
        Ok(self.set_start_cmd(start, ReadyCmd::wait_for_file("/devcontainer.up")))
    }

    /// Refuses a helper that needs E2B's template `name` as the base (exactly that name, as
    /// the SDK compares it).
    fn require_base_template(&self, name: &str, what: &str) -> Result<(), Error> {
        if matches!(&self.base, Base::Template(base) if base == name) {
            return Ok(());
        }
        Err(Error::InvalidInput {
            operation: Operation::BuildTemplate,
            sandbox_id: None,
            reason: format!(
                "{what} can only be added to a template built on the {name} template \
                 (TemplateSpec::from_template(\"{name}\"))"
            ),
        })
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

    /// The template as the SDK's `Template.to_dockerfile` writes it: `FROM image`, then a
    /// line per step (`RUN command`, `COPY src dest`, `ENV k=v …`, `WORKDIR`, `USER`), then
    /// `ENTRYPOINT start-command`. Like the SDK's, it drops what a plain Dockerfile line
    /// cannot say as the SDK writes it: a RUN's user, a COPY's owner and mode, the ready
    /// command, registry credentials, and no value is quoted. A template built on another
    /// template has no Dockerfile: refused ([`Error::is_invalid_request`],
    /// [`Operation::RenderTemplate`]).
    ///
    /// ```
    /// use e2b_client::template::TemplateSpec;
    ///
    /// let spec = TemplateSpec::from_python_image("3")
    ///     .set_envs([("PORT", "8000")])
    ///     .run_cmd("pip install flask");
    /// assert_eq!(
    ///     spec.to_dockerfile()?,
    ///     "FROM python:3\nENV PORT=8000\nRUN pip install flask\n"
    /// );
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn to_dockerfile(&self) -> Result<String, Error> {
        self.start_body(&[], false)
            .sdk_dockerfile()
            .map_err(|reason| Error::InvalidInput {
                operation: Operation::RenderTemplate,
                sandbox_id: None,
                reason,
            })
    }

    /// The template as the SDK's `Template.to_json` writes it: the start-build body a build
    /// of this spec sends (without [`BuildCache::Skip`](super::BuildCache::Skip)), in the
    /// SDK's key order, indented by two spaces, non-ASCII escaped. Each COPY step carries
    /// its `filesHash`, so the file context is read (blocking; the current directory
    /// without one) and a source that matches nothing is refused
    /// ([`Error::is_invalid_request`], [`Operation::RenderTemplate`]). Registry credentials
    /// are in it in clear, as in the body: treat the text as a secret then.
    ///
    /// ```
    /// use e2b_client::template::{ReadyCmd, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image()
    ///     .run_cmd("echo hi")
    ///     .set_start_cmd("sleep infinity", ReadyCmd::new("true"));
    /// let json: serde_json::Value = serde_json::from_str(&spec.to_json()?).unwrap();
    /// assert_eq!(json["steps"][0]["args"][0], "echo hi");
    /// assert_eq!(json["fromImage"], "e2bdev/base");
    /// # Ok::<(), e2b_client::Error>(())
    /// ```
    pub fn to_json(&self) -> Result<String, Error> {
        let refuse = |reason: String| Error::InvalidInput {
            operation: Operation::RenderTemplate,
            sandbox_id: None,
            reason,
        };
        let context = match &self.context {
            Some(dir) => dir.clone(),
            None => std::env::current_dir()
                .map_err(|error| refuse(format!("the current directory is unknown: {error}")))?,
        };
        let mut hashes = vec![None; self.steps.len()];
        for (index, plan) in self.copies() {
            let hash = copy_hash(&context, &plan)
                .map_err(|reason| refuse(format!("COPY \"{}\": {reason}", plan.src)))?;
            hashes[index] = Some(hash);
        }
        Ok(self.start_body(&hashes, false).sdk_json())
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
