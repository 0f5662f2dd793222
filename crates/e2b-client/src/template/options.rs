//! The options of the template helpers: how each runs its command, spelled as the SDK's
//! keyword arguments but with an enum where the SDK takes a flag.

#[cfg(doc)]
use super::TemplateSpec;

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

/// One source of [`TemplateSpec::copy_items`]: the arguments of a [`TemplateSpec::copy`] as
/// a value, for copies listed in data. Start from [`CopyItem::new`].
#[derive(Clone, Debug)]
pub struct CopyItem {
    /// The source: a path or glob relative to the file context.
    pub src: String,
    /// Where it goes in the template.
    pub dest: String,
    /// How it is copied.
    pub options: CopyOptions,
}

impl CopyItem {
    /// `src` to `dest` with the SDK's default [`CopyOptions`].
    pub fn new(src: impl Into<String>, dest: impl Into<String>) -> CopyItem {
        CopyItem {
            src: src.into(),
            dest: dest.into(),
            options: CopyOptions::new(),
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
    /// `-m` with these permission bits (0 too, as the SDK writes it); `None`: no `-m`.
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
