//! A Dockerfile turned into template steps the way the official SDK's `from_dockerfile` does
//! it (`e2b` 2.63 with `e2b-dockerfile-utils` 0.1): one stage only; RUN, COPY and ADD (local
//! sources), WORKDIR, USER, ENV and ARG become steps; CMD and ENTRYPOINT become the start
//! command, combined as Docker combines them; EXPOSE, VOLUME, LABEL and MAINTAINER are
//! dropped silently, HEALTHCHECK, ONBUILD, SHELL and STOPSIGNAL with a warning. Pure: no
//! file is read here.

mod shell;
mod syntax;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

pub(super) use self::shell::shell_quote;
use self::shell::{Lexer, Variables};
use self::syntax::{Expansion, Form, Heredoc, Instruction, heredoc_marker, is_python_space};

/// Why a Dockerfile is refused, and the 1-based line of the instruction, when one is to
/// blame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DockerfileError {
    pub(crate) line: Option<usize>,
    pub(crate) reason: String,
}

impl DockerfileError {
    fn at(line: usize, reason: impl Into<String>) -> DockerfileError {
        DockerfileError {
            line: Some(line),
            reason: reason.into(),
        }
    }

    fn whole(reason: impl Into<String>) -> DockerfileError {
        DockerfileError {
            line: None,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for DockerfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// One template step a Dockerfile instruction became.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A RUN step (`user`: as whom, else the current user).
    Run {
        command: String,
        user: Option<String>,
    },
    /// A COPY step from the file context; `line` is the instruction's, for the check of the
    /// source.
    Copy {
        src: String,
        dest: String,
        user: Option<String>,
        mode: Option<u32>,
        line: usize,
    },
    Workdir(String),
    User(String),
    /// An ENV step: names in first-seen order, each with its last value.
    Env(Vec<(String, String)>),
}

/// What a Dockerfile amounts to.
#[derive(Clone, Debug)]
pub(crate) struct Converted {
    /// The FROM image, as written (references are not expanded, as in the SDK).
    pub(crate) base_image: String,
    pub(crate) steps: Vec<Step>,
    /// From CMD and ENTRYPOINT; its ready command is the SDK's 20 s wait.
    pub(crate) start_cmd: Option<String>,
    /// What was left out or looks wrong, one sentence each, with its line.
    pub(crate) warnings: Vec<String>,
}

/// Reads and converts a Dockerfile.
pub(crate) fn convert(content: &str) -> Result<Converted, DockerfileError> {
    let ast = syntax::parse(content)?;
    let mut converter = Converter {
        lexer: Lexer::keeping_variables(ast.escape),
        vars: HashMap::new(),
        user_set: false,
        workdir_set: false,
        cmd: None,
        entrypoint: None,
        steps: Vec::new(),
        warnings: ast.warnings,
    };
    let base_image = converter.run(&ast.instructions)?;
    Ok(Converted {
        base_image,
        start_cmd: converter.start_cmd(),
        steps: converter.steps,
        warnings: converter.warnings,
    })
}

/// A flag's value: text (`--chown=a`) or a switch (`--link`, `--link=false`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlagKind {
    Text,
    Switch,
}

/// Whether a template can honour a flag; the others are accepted with a warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlagUse {
    Applied,
    Ignored,
}

type FlagSpec = (&'static str, FlagKind, FlagUse);

const RUN_FLAGS: &[FlagSpec] = &[
    ("mount", FlagKind::Text, FlagUse::Ignored),
    ("network", FlagKind::Text, FlagUse::Ignored),
    ("security", FlagKind::Text, FlagUse::Ignored),
    ("device", FlagKind::Text, FlagUse::Ignored),
];

const COPY_FLAGS: &[FlagSpec] = &[
    ("chown", FlagKind::Text, FlagUse::Applied),
    ("chmod", FlagKind::Text, FlagUse::Applied),
    ("from", FlagKind::Text, FlagUse::Applied),
    ("link", FlagKind::Switch, FlagUse::Ignored),
    ("exclude", FlagKind::Text, FlagUse::Ignored),
    ("parents", FlagKind::Switch, FlagUse::Ignored),
];

/// ADD's flags besides COPY's.
const ADD_FLAGS: &[FlagSpec] = &[
    ("keep-git-dir", FlagKind::Switch, FlagUse::Ignored),
    ("checksum", FlagKind::Text, FlagUse::Ignored),
    ("unpack", FlagKind::Switch, FlagUse::Ignored),
];

const FROM_FLAGS: &[FlagSpec] = &[("platform", FlagKind::Text, FlagUse::Ignored)];

/// CMD or ENTRYPOINT as written.
#[derive(Clone, Debug)]
struct StartForm {
    form: Form,
    args: Vec<String>,
}

#[derive(Debug)]
struct Converter {
    /// Reads arguments, keeping `$VAR` for the build's shell.
    lexer: Lexer<'static>,
    /// The ARG and ENV values so far, resolved (only `--chmod` is resolved with them).
    vars: HashMap<String, String>,
    user_set: bool,
    workdir_set: bool,
    cmd: Option<StartForm>,
    entrypoint: Option<StartForm>,
    steps: Vec<Step>,
    warnings: Vec<String>,
}

impl Converter {
    /// The steps of every instruction; the base image.
    fn run(&mut self, instructions: &[Instruction]) -> Result<String, DockerfileError> {
        let mut froms = instructions.iter().filter(|i| i.name == "FROM");
        let Some(from) = froms.next() else {
            return Err(DockerfileError::whole("there is no FROM instruction"));
        };
        if froms.next().is_some() {
            return Err(DockerfileError::whole(
                "more than one FROM: multi-stage Dockerfiles are not supported",
            ));
        }
        let base_image = self.from(from)?;
        // Docker's defaults while the instructions run.
        self.steps.push(Step::User("root".to_owned()));
        self.steps.push(Step::Workdir("/".to_owned()));
        for instruction in instructions {
            if instruction.name == "FROM" {
                continue;
            }
            if instruction.line < from.line && instruction.name != "ARG" {
                return Err(DockerfileError::at(
                    instruction.line,
                    format!("{} comes before FROM (only ARG may)", instruction.name),
                ));
            }
            self.instruction(instruction)?;
        }
        // E2B's defaults for the sandboxes, unless the Dockerfile chose.
        if !self.user_set {
            self.steps.push(Step::User("user".to_owned()));
        }
        if !self.workdir_set {
            self.steps.push(Step::Workdir("/home/user".to_owned()));
        }
        Ok(base_image)
    }

    fn instruction(&mut self, instruction: &Instruction) -> Result<(), DockerfileError> {
        match instruction.name.as_str() {
            "RUN" => self.run_step(instruction),
            "COPY" => self.copy(instruction, &[COPY_FLAGS]),
            "ADD" => self.copy(instruction, &[COPY_FLAGS, ADD_FLAGS]),
            "WORKDIR" => {
                let workdir = self.single(instruction)?;
                self.steps.push(Step::Workdir(workdir));
                self.workdir_set = true;
                Ok(())
            }
            "USER" => {
                let user = self.single(instruction)?;
                self.steps.push(Step::User(user));
                self.user_set = true;
                Ok(())
            }
            "ENV" => self.env(instruction),
            "ARG" => self.arg(instruction),
            "CMD" | "ENTRYPOINT" => {
                self.flags(instruction, &[])?;
                let form = StartForm {
                    form: instruction.form,
                    args: instruction.args.clone(),
                };
                if instruction.name == "CMD" {
                    self.cmd = Some(form);
                } else {
                    self.entrypoint = Some(form);
                }
                Ok(())
            }
            // Metadata a template has no use for.
            "EXPOSE" | "VOLUME" | "LABEL" | "MAINTAINER" => Ok(()),
            other => {
                self.warnings.push(format!(
                    "line {}: {other} has no template equivalent and is ignored",
                    instruction.line
                ));
                Ok(())
            }
        }
    }

    /// A word with quotes and escapes resolved, references kept.
    fn expand(&self, instruction: &Instruction, word: &str) -> Result<String, DockerfileError> {
        self.lexer
            .word(word)
            .map_err(|reason| DockerfileError::at(instruction.line, reason))
    }

    /// A word with the ARG and ENV values so far substituted (unknown names: empty).
    fn resolve(&self, instruction: &Instruction, word: &str) -> Result<String, DockerfileError> {
        Lexer {
            variables: Variables::Resolve(&self.vars),
            ..self.lexer
        }
        .word(word)
        .map_err(|reason| DockerfileError::at(instruction.line, reason))
    }

    /// The instruction's one argument (WORKDIR, USER), read.
    fn single(&mut self, instruction: &Instruction) -> Result<String, DockerfileError> {
        self.flags(instruction, &[])?;
        let [arg] = instruction.args.as_slice() else {
            return Err(DockerfileError::at(
                instruction.line,
                format!("{} takes exactly one argument", instruction.name),
            ));
        };
        self.expand(instruction, arg)
    }

    /// The builder flags, checked against what the instruction knows; the values of those
    /// a template applies.
    fn flags(
        &mut self,
        instruction: &Instruction,
        known: &[&[FlagSpec]],
    ) -> Result<HashMap<String, String>, DockerfileError> {
        let refuse = |reason: String| DockerfileError::at(instruction.line, reason);
        let mut values = HashMap::new();
        for flag in &instruction.flags {
            let Some(body) = flag.strip_prefix("--") else {
                return Err(refuse(format!("the flag {flag:?} does not start with --")));
            };
            let (name, value) = match body.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (body, None),
            };
            let Some((_, kind, usage)) = known
                .iter()
                .flat_map(|specs| specs.iter())
                .find(|(known, _, _)| *known == name)
            else {
                return Err(refuse(format!("{} has no flag --{name}", instruction.name)));
            };
            if values.contains_key(name) {
                return Err(refuse(format!("the flag --{name} is given twice")));
            }
            let value = match (kind, value) {
                (FlagKind::Switch, None | Some("" | "true")) => "true".to_owned(),
                (FlagKind::Switch, Some("false")) => "false".to_owned(),
                (FlagKind::Switch, Some(other)) => {
                    return Err(refuse(format!(
                        "the flag --{name} is true or false, not {other:?}"
                    )));
                }
                (FlagKind::Text, None) => {
                    return Err(refuse(format!(
                        "the flag --{name} needs a value (--{name}=…)"
                    )));
                }
                (FlagKind::Text, Some(value)) => value.to_owned(),
            };
            if *usage == FlagUse::Ignored {
                self.warnings.push(format!(
                    "line {}: {} --{name} is not supported by templates and is ignored",
                    instruction.line, instruction.name
                ));
                continue;
            }
            values.insert(name.to_owned(), value);
        }
        Ok(values)
    }

    fn from(&mut self, instruction: &Instruction) -> Result<String, DockerfileError> {
        self.flags(instruction, &[FROM_FLAGS])?;
        let image = match instruction.args.as_slice() {
            // `FROM image AS name`: a single stage needs no name.
            [image, as_, _] if as_.eq_ignore_ascii_case("as") => image,
            [image] => image,
            _ => {
                return Err(DockerfileError::at(
                    instruction.line,
                    "FROM takes an image, optionally followed by AS and a name",
                ));
            }
        };
        self.expand(instruction, image)
    }

    fn run_step(&mut self, instruction: &Instruction) -> Result<(), DockerfileError> {
        self.flags(instruction, &[RUN_FLAGS])?;
        let Some(first) = instruction.args.first() else {
            return Err(DockerfileError::at(instruction.line, "RUN needs a command"));
        };
        let command = match instruction.form {
            Form::Json => shell_join(&instruction.args),
            Form::Shell if !instruction.heredocs.is_empty() => {
                run_with_heredocs(first, &instruction.heredocs)
                    .map_err(|reason| DockerfileError::at(instruction.line, reason))?
            }
            Form::Shell => first.clone(),
        };
        self.steps.push(Step::Run {
            command,
            user: None,
        });
        Ok(())
    }

    fn copy(
        &mut self,
        instruction: &Instruction,
        known: &[&[FlagSpec]],
    ) -> Result<(), DockerfileError> {
        let name = &instruction.name;
        let line = instruction.line;
        let refuse = |reason: String| DockerfileError::at(line, reason);
        let flags = self.flags(instruction, known)?;
        let [sources @ .., raw_dest] = instruction.args.as_slice() else {
            return Err(refuse(format!("{name} needs a source and a destination")));
        };
        if sources.is_empty() {
            return Err(refuse(format!("{name} needs a source and a destination")));
        }
        if flags.contains_key("from") {
            return Err(refuse(format!(
                "{name} --from is not supported (multi-stage builds are not)"
            )));
        }
        let user = flags
            .get("chown")
            .map(|chown| self.expand(instruction, chown))
            .transpose()?;
        let mode = match flags.get("chmod") {
            None => None,
            Some(chmod) => {
                let written = self.expand(instruction, chmod)?;
                let resolved = self.resolve(instruction, chmod)?;
                Some(octal_mode(&resolved).ok_or_else(|| {
                    let through = if resolved == written {
                        String::new()
                    } else {
                        format!(" (which is {resolved:?})")
                    };
                    refuse(format!(
                        "--chmod={written:?}{through} is not an octal mode like 0755"
                    ))
                })?)
            }
        };
        // Markers count as written: a quoted "<<EOF" is a file name.
        if heredoc_marker(raw_dest).map_err(&refuse)?.is_some() {
            return Err(refuse(format!(
                "{name} cannot take a heredoc as its destination"
            )));
        }
        let dest = self.expand(instruction, raw_dest)?;
        for raw_src in sources {
            if let Some(marker) = heredoc_marker(raw_src).map_err(&refuse)? {
                // The last body of that name, as the SDK looks them up.
                let Some(heredoc) = instruction
                    .heredocs
                    .iter()
                    .rev()
                    .find(|heredoc| heredoc.name == marker.name)
                else {
                    return Err(refuse(format!("the heredoc {} has no body", marker.name)));
                };
                let command =
                    copy_heredoc_command(heredoc, &dest, user.as_deref(), mode).map_err(&refuse)?;
                self.steps.push(Step::Run {
                    command,
                    // COPY writes as the builder, whatever USER says.
                    user: Some("root".to_owned()),
                });
                continue;
            }
            let src = self.expand(instruction, raw_src)?;
            if name == "ADD" && is_remote_url(&src) {
                return Err(refuse(format!(
                    "ADD of a remote URL ({src}) is not supported; download it in a RUN step"
                )));
            }
            self.steps.push(Step::Copy {
                src,
                dest: dest.clone(),
                user: user.clone(),
                mode,
                line,
            });
        }
        Ok(())
    }

    fn env(&mut self, instruction: &Instruction) -> Result<(), DockerfileError> {
        self.flags(instruction, &[])?;
        if instruction.args.is_empty() {
            return Err(DockerfileError::at(
                instruction.line,
                "ENV needs a name and a value",
            ));
        }
        let mut envs = Envs::default();
        for triple in instruction.args.chunks_exact(3) {
            let key = self.expand(instruction, &triple[0])?;
            if key.is_empty() {
                return Err(DockerfileError::at(
                    instruction.line,
                    "ENV has an empty name",
                ));
            }
            envs.set(&key, self.expand(instruction, &triple[1])?);
            let resolved = self.resolve(instruction, &triple[1])?;
            self.vars.insert(key, resolved);
        }
        self.steps.push(Step::Env(envs.0));
        Ok(())
    }

    fn arg(&mut self, instruction: &Instruction) -> Result<(), DockerfileError> {
        self.flags(instruction, &[])?;
        if instruction.args.is_empty() {
            return Err(DockerfileError::at(instruction.line, "ARG needs a name"));
        }
        let mut envs = Envs::default();
        for arg in &instruction.args {
            let (name, value) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (arg.as_str(), None),
            };
            let key = self.expand(instruction, name)?;
            if key.is_empty() {
                return Err(DockerfileError::at(
                    instruction.line,
                    "ARG has an empty name",
                ));
            }
            let (written, resolved) = match value {
                Some(value) => (
                    self.expand(instruction, value)?,
                    self.resolve(instruction, value)?,
                ),
                None => (String::new(), String::new()),
            };
            envs.set(&key, written);
            self.vars.insert(key, resolved);
        }
        self.steps.push(Step::Env(envs.0));
        Ok(())
    }

    /// Docker's rules: an exec-form ENTRYPOINT takes CMD as more arguments (a shell-form CMD
    /// as `/bin/sh -c CMD`); a shell-form ENTRYPOINT ignores CMD; without ENTRYPOINT, CMD
    /// alone. A blank command is none.
    fn start_cmd(&self) -> Option<String> {
        let command = match (&self.entrypoint, &self.cmd) {
            (Some(entrypoint), cmd) if entrypoint.form == Form::Json => {
                let mut words = entrypoint.args.clone();
                match cmd {
                    Some(cmd) if cmd.form == Form::Json => words.extend(cmd.args.iter().cloned()),
                    Some(cmd) => {
                        if let Some(line) = cmd.args.first() {
                            words.extend(["/bin/sh".to_owned(), "-c".to_owned(), line.clone()]);
                        }
                    }
                    None => {}
                }
                (!words.is_empty()).then(|| shell_join(&words))
            }
            (Some(entrypoint), _) => entrypoint.args.first().cloned(),
            (None, Some(cmd)) if cmd.form == Form::Json => {
                (!cmd.args.is_empty()).then(|| shell_join(&cmd.args))
            }
            (None, Some(cmd)) => cmd.args.first().cloned(),
            (None, None) => None,
        }?;
        let blank = command.chars().all(is_python_space);
        (!blank).then_some(command)
    }
}

/// ENV pairs in first-seen order, a repeated name keeping its place and taking the new
/// value (a Python dict's behaviour).
#[derive(Debug, Default)]
struct Envs(Vec<(String, String)>);

impl Envs {
    fn set(&mut self, key: &str, value: String) {
        match self.0.iter_mut().find(|(name, _)| name == key) {
            Some((_, old)) => *old = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }
}

/// Words as one shell command line, each quoted as `shlex.quote` does.
fn shell_join(words: &[String]) -> String {
    words
        .iter()
        .map(|word| shell_quote(word))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `755`, `0644`: three or four octal digits.
fn octal_mode(text: &str) -> Option<u32> {
    let octal = (3..=4).contains(&text.len()) && text.bytes().all(|b| (b'0'..=b'7').contains(&b));
    octal.then(|| u32::from_str_radix(text, 8).ok()).flatten()
}

/// `scheme://…` (a letter, then letters, digits, `+`, `.` or `-`).
fn is_remote_url(src: &str) -> bool {
    let Some((scheme, _)) = src.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// A delimiter for `content` that does not occur in it: `E2B_HEREDOC_<name>` (other
/// characters than ASCII letters, digits and `_` as `_`), with `_` added until unique.
fn terminator(name: &str, content: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut terminator = format!("E2B_HEREDOC_{safe}");
    while content.contains(&terminator) {
        terminator.push('_');
    }
    terminator
}

fn with_trailing_newline(content: &str) -> String {
    if content.is_empty() || content.ends_with('\n') {
        content.to_owned()
    } else {
        format!("{content}\n")
    }
}

/// RUN with heredocs. `RUN <<EOF` alone runs the body as the script (a `#!` script from a
/// file of its own, so its interpreter runs it); heredocs within a longer command are put
/// back after it for the shell to read.
fn run_with_heredocs(line: &str, heredocs: &[Heredoc]) -> Result<String, String> {
    let trimmed = line.trim_matches(is_python_space);
    if let [heredoc] = heredocs
        && heredoc_marker(trimmed)?.is_some()
    {
        let content = heredoc.body();
        if !content.starts_with("#!") {
            return Ok(content);
        }
        let script = shell_quote(&format!("/tmp/{}", heredoc.name));
        let end = terminator(&heredoc.name, &content);
        return Ok(format!(
            "cat <<'{end}' >{script}\n{}{end}\nchmod +x {script} && {script}\n\
             E2B_EXIT=$?; rm -f {script}; exit $E2B_EXIT",
            with_trailing_newline(&content)
        ));
    }
    let mut full = line.to_owned();
    for heredoc in heredocs {
        full.push('\n');
        full.push_str(&heredoc.content);
        full.push_str(&heredoc.name);
    }
    Ok(full)
}

/// `COPY <<EOF DEST` as a shell command that writes the body to DEST (or to DEST/EOF when
/// DEST is a directory, as Docker does), then sets its owner and mode.
fn copy_heredoc_command(
    heredoc: &Heredoc,
    dest: &str,
    user: Option<&str>,
    mode: Option<u32>,
) -> Result<String, String> {
    let mut content = heredoc.body();
    if heredoc.expansion == Expansion::Expand {
        content = expandable_body(&content)?;
    }
    let plain = terminator(&heredoc.name, &content);
    let delimiter = match heredoc.expansion {
        Expansion::Expand => plain.clone(),
        Expansion::Literal => format!("'{plain}'"),
    };
    let target = "\"$E2B_HEREDOC_DEST\"";
    let mut command = if dest.ends_with('/') {
        format!(
            "E2B_HEREDOC_DEST={}\n",
            shell_quote(&format!("{dest}{}", heredoc.name))
        )
    } else {
        format!(
            "E2B_HEREDOC_DEST={}\nif [ -d {target} ]; then E2B_HEREDOC_DEST={target}/{}; fi\n",
            shell_quote(dest),
            shell_quote(&heredoc.name)
        )
    };
    command.push_str(&format!(
        "mkdir -p \"$(dirname {target})\" && cat <<{delimiter} >{target}\n{}{plain}",
        with_trailing_newline(&content)
    ));
    if let Some(user) = user {
        command.push_str(&format!("\nchown {} {target}", shell_quote(user)));
    }
    if let Some(mode) = mode {
        command.push_str(&format!("\nchmod {mode:o} {target}"));
    }
    Ok(command)
}

/// An expanding heredoc body made safe for the shell's unquoted heredoc so that it follows
/// Docker's rules instead: `$VAR` and `${VAR…}` are substituted, `\` escapes the next
/// character, and the rest (`$(…)` and backquotes too) is literal. In `#`, `%` and `/`
/// patterns a `\` keeps its meaning for the shell's matching.
fn expandable_body(content: &str) -> Result<String, String> {
    let mut body = Body {
        chars: content.chars().collect(),
        pos: 0,
    };
    body.scan(None, Escapes::Literal)
}

/// How `\` in a heredoc body reaches the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escapes {
    /// As an escape of the character after it, for a character the shell would otherwise
    /// treat specially.
    Literal,
    /// As written (inside a pattern).
    Pattern,
}

#[derive(Debug)]
struct Body {
    chars: Vec<char>,
    pos: usize,
}

impl Body {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn unclosed(stop: char) -> String {
        if stop == '/' {
            "a '${…/' in the heredoc has no second '/'".to_owned()
        } else {
            "a '${' in the heredoc is not closed".to_owned()
        }
    }

    fn scan(&mut self, stop: Option<char>, escapes: Escapes) -> Result<String, String> {
        let mut out = String::new();
        while let Some(c) = self.next() {
            if Some(c) == stop {
                return Ok(out);
            }
            match c {
                '\\' => {
                    if let Some(next) = self.next() {
                        let special = matches!(next, '\\' | '`' | '$') || Some(next) == stop;
                        if escapes == Escapes::Pattern || special {
                            out.push('\\');
                        }
                        out.push(next);
                    }
                }
                '$' => out.push_str(&self.variable()?),
                '`' => out.push_str("\\`"),
                c => out.push(c),
            }
        }
        match stop {
            Some(stop) => Err(Body::unclosed(stop)),
            None => Ok(out),
        }
    }

    /// A name as the shell reads one after `$`: digits, one special character, or a word.
    fn name(&mut self) -> String {
        let Some(first) = self.peek() else {
            return String::new();
        };
        let take = |body: &mut Body, keep: &dyn Fn(char) -> bool| {
            let mut name = String::new();
            while let Some(c) = body.peek().filter(|c| keep(*c)) {
                name.push(c);
                body.pos += 1;
            }
            name
        };
        if first.is_ascii_digit() {
            take(self, &|c| c.is_ascii_digit())
        } else if "@*#?-$!0".contains(first) {
            self.pos += 1;
            first.to_string()
        } else {
            take(self, &|c| c.is_alphanumeric() || c == '_')
        }
    }

    /// After a `$`.
    fn variable(&mut self) -> Result<String, String> {
        if self.peek() != Some('{') {
            let name = self.name();
            return Ok(if name.is_empty() {
                "\\$".to_owned()
            } else {
                format!("${name}")
            });
        }
        self.pos += 1;
        match self.peek() {
            None => return Err(Body::unclosed('}')),
            Some('{' | '}' | ':') => return Err("a '${' in the heredoc is malformed".to_owned()),
            Some(_) => {}
        }
        let name = self.name();
        let Some(first) = self.next() else {
            return Err(Body::unclosed('}'));
        };
        match first {
            '}' => return Ok(format!("${{{name}}}")),
            '/' => {
                let op = if self.peek() == Some('/') {
                    self.pos += 1;
                    "//"
                } else {
                    "/"
                };
                let pattern = self.scan(Some('/'), Escapes::Pattern)?;
                let with = self.scan(Some('}'), Escapes::Pattern)?;
                return Ok(format!("${{{name}{op}{pattern}/{with}}}"));
            }
            _ => {}
        }
        let mut modifier = first.to_string();
        if first == ':' {
            let Some(second) = self.next() else {
                return Err(Body::unclosed('}'));
            };
            modifier.push(second);
        }
        let op = modifier.chars().last().unwrap_or(first);
        let pattern = matches!(op, '#' | '%');
        if !"+-?#%".contains(op) || (first == ':' && pattern) {
            return Err(format!(
                "the modifier '{modifier}' in the heredoc is not supported"
            ));
        }
        let escapes = if pattern {
            Escapes::Pattern
        } else {
            Escapes::Literal
        };
        let word = self.scan(Some('}'), escapes)?;
        Ok(format!("${{{name}{modifier}{word}}}"))
    }
}
