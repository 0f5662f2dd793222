//! A Dockerfile's text as a list of instructions (BuildKit's parser rules, as the SDK ports
//! them): parser directives (`# escape=`), comments, line continuations, builder flags
//! (`--chown=…`), the JSON (exec) form and heredocs. Nothing here knows what an instruction
//! does.

use super::DockerfileError;
use super::shell::{Escapes, Lexer, Quotes, Variables, is_space};

/// The instructions whose text may open heredocs.
const HEREDOC_INSTRUCTIONS: [&str; 3] = ["ADD", "COPY", "RUN"];

/// How an instruction's arguments were written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Form {
    /// Shell form: the text (or its words) as written.
    Shell,
    /// JSON (exec) form: `["a", "b"]`.
    Json,
}

/// Whether a heredoc's lines lose their leading tabs (`<<-`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tabs {
    Keep,
    Strip,
}

/// Whether a heredoc's body is subject to variable expansion (an unquoted delimiter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expansion {
    Expand,
    Literal,
}

/// A heredoc marker (`<<EOF`, `<<-"EOF"`) and, once read, its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Heredoc {
    /// The delimiter, unquoted.
    pub(super) name: String,
    /// The lines up to the delimiter, each with its newline.
    pub(super) content: String,
    pub(super) tabs: Tabs,
    pub(super) expansion: Expansion,
}

impl Heredoc {
    /// The body, its lines' leading tabs removed for `<<-`.
    pub(super) fn body(&self) -> String {
        match self.tabs {
            Tabs::Keep => self.content.clone(),
            Tabs::Strip => strip_leading_tabs(&self.content),
        }
    }
}

/// One instruction.
#[derive(Clone, Debug)]
pub(super) struct Instruction {
    /// The keyword, upper-cased (`RUN`).
    pub(super) name: String,
    /// The builder flags (`--chown=a:b`), quotes removed.
    pub(super) flags: Vec<String>,
    /// The arguments; for ENV and LABEL `[name, value, separator]` triples, the separator
    /// being `=` or empty (the `ENV name value` form).
    pub(super) args: Vec<String>,
    pub(super) form: Form,
    pub(super) heredocs: Vec<Heredoc>,
    /// The 1-based line the instruction starts on.
    pub(super) line: usize,
}

/// The instructions, the escape character in force, and what the reader warned about.
#[derive(Debug)]
pub(super) struct Ast {
    pub(super) instructions: Vec<Instruction>,
    pub(super) escape: char,
    pub(super) warnings: Vec<String>,
}

/// Python's `str.isspace` (what `strip()` and a regex's `\s` remove): Unicode whitespace and
/// the ASCII separators `\x1c`–`\x1f`.
pub(super) fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// The separators BuildKit's whitespace regex knows: `[\t\v\f\r ]`.
fn is_ascii_blank(c: char) -> bool {
    matches!(c, '\t' | '\x0b' | '\x0c' | '\r' | ' ')
}

fn trim_newline(line: &str) -> &str {
    line.trim_end_matches(['\r', '\n'])
}

fn trim_leading_space(line: &str) -> &str {
    line.trim_start_matches(is_space)
}

fn is_comment(line: &str) -> bool {
    trim_leading_space(line).starts_with('#')
}

/// Every line's leading tabs removed (`<<-` heredocs).
pub(super) fn strip_leading_tabs(content: &str) -> String {
    content
        .split_inclusive('\n')
        .map(|line| line.trim_start_matches('\t'))
        .collect()
}

/// The parser directives at the top of the file, and the escape character they set.
#[derive(Debug)]
struct Directives {
    escape: char,
    /// A line that is no directive was seen: no later line is one.
    done: bool,
    seen: Vec<String>,
}

impl Directives {
    /// Takes `line` as a directive if it is one; an invalid or repeated one is an error.
    fn observe(&mut self, line: &str) -> Result<(), String> {
        if self.done {
            return Ok(());
        }
        let Some((key, value)) = directive(line) else {
            self.done = true;
            return Ok(());
        };
        let key = key.to_ascii_lowercase();
        if !matches!(key.as_str(), "syntax" | "escape" | "check") {
            self.done = true;
            return Ok(());
        }
        if self.seen.contains(&key) {
            return Err(format!("the {key} parser directive is given twice"));
        }
        if key == "escape" {
            self.escape = match value {
                "\\" => '\\',
                "`" => '`',
                other => {
                    return Err(format!(
                        "the escape character must be \\ or `, not {other:?}"
                    ));
                }
            };
        }
        self.seen.push(key);
        Ok(())
    }

    /// The line without a trailing escape character (with blanks after it) that continues
    /// it on the next line, and whether the instruction ends here.
    fn trim_continuation<'l>(&self, line: &'l str) -> (&'l str, Ending) {
        let body = line.trim_end_matches([' ', '\t']);
        if let Some(before) = body.strip_suffix(self.escape)
            && (before.is_empty() || !before.ends_with(self.escape))
        {
            return (before, Ending::Continues);
        }
        (line, Ending::Ends)
    }
}

/// Whether an instruction's text goes on to the next line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Ends,
    Continues,
}

/// `# key = value`: an ASCII key (a letter, then letters and digits) and a non-empty value.
fn directive(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix('#')?.trim_start_matches(is_python_space);
    let key_len = rest
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_alphabetic() || (*i > 0 && c.is_ascii_digit())))
        .map_or(rest.len(), |(i, _)| i);
    if key_len == 0 {
        return None;
    }
    let (key, rest) = rest.split_at(key_len);
    let rest = rest.trim_start_matches(is_python_space).strip_prefix('=')?;
    let value = rest.trim_matches(is_python_space);
    if !value.is_empty() {
        return Some((key, value));
    }
    // All blanks: the pattern's lazy value takes the last one.
    let last = rest.char_indices().last()?.0;
    Some((key, &rest[last..]))
}

/// Reads a Dockerfile's instructions.
pub(super) fn parse(content: &str) -> Result<Ast, DockerfileError> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let lines: Vec<&str> = content.split_inclusive('\n').collect();
    let mut directives = Directives {
        escape: '\\',
        done: false,
        seen: Vec::new(),
    };
    let mut instructions = Vec::new();
    let mut warnings = Vec::new();
    let mut current = 0;
    let mut index = 0;

    while index < lines.len() {
        let raw = lines[index];
        index += 1;
        let first = read_line(&mut directives, raw, current + 1, Leading::Strip)?;
        current += 1;
        let start = current;
        let (trimmed, mut ending) = directives.trim_continuation(&first);
        let mut line = trimmed.to_owned();
        if ending == Ending::Ends && line.is_empty() {
            continue;
        }
        let mut empty_continuation = false;
        while ending == Ending::Continues && index < lines.len() {
            let raw = lines[index];
            index += 1;
            let next = read_line(&mut directives, raw, current + 1, Leading::Keep)?;
            current += 1;
            if is_comment(raw) {
                continue;
            }
            if trim_leading_space(trim_newline(raw)).is_empty() {
                empty_continuation = true;
                continue;
            }
            let (trimmed, next_ending) = directives.trim_continuation(&next);
            line.push_str(trimmed);
            ending = next_ending;
        }
        if empty_continuation {
            warnings.push(format!(
                "line {current}: an empty line continues an instruction (`{line}`); later \
                 Docker versions refuse this"
            ));
        }

        let (command, flags, rest) = split_command(&line, directives.escape);
        let name = command.to_uppercase();
        let (args, form) = arguments(&name, &command, &rest, directives.escape)
            .map_err(|reason| DockerfileError::at(start, reason))?;
        let mut instruction = Instruction {
            name,
            flags,
            args,
            form,
            heredocs: Vec::new(),
            line: start,
        };
        if HEREDOC_INSTRUCTIONS.contains(&instruction.name.as_str())
            && form == Form::Shell
            && line.contains("<<")
        {
            let markers =
                heredocs_in_line(&line).map_err(|reason| DockerfileError::at(start, reason))?;
            for mut heredoc in markers {
                let mut body = String::new();
                let mut terminated = false;
                while index < lines.len() {
                    let raw = lines[index];
                    index += 1;
                    current += 1;
                    let mut candidate = trim_newline(raw);
                    if heredoc.tabs == Tabs::Strip {
                        candidate = candidate.trim_start_matches('\t');
                    }
                    if candidate == heredoc.name {
                        terminated = true;
                        break;
                    }
                    body.push_str(raw);
                }
                if !terminated {
                    return Err(DockerfileError::at(
                        start,
                        format!("the heredoc {} has no closing line", heredoc.name),
                    ));
                }
                heredoc.content = body;
                instruction.heredocs.push(heredoc);
            }
        }
        instructions.push(instruction);
    }
    Ok(Ast {
        instructions,
        escape: directives.escape,
        warnings,
    })
}

/// Whether a line's leading blanks go (an instruction's first line) or stay (the lines that
/// continue it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leading {
    Strip,
    Keep,
}

/// A line as read: no newline, maybe no leading blanks, checked for a directive, and empty
/// if it is a comment.
fn read_line(
    directives: &mut Directives,
    raw: &str,
    number: usize,
    leading: Leading,
) -> Result<String, DockerfileError> {
    let mut line = trim_newline(raw);
    if leading == Leading::Strip {
        line = trim_leading_space(line);
    }
    directives
        .observe(line)
        .map_err(|reason| DockerfileError::at(number, reason))?;
    Ok(if is_comment(line) {
        String::new()
    } else {
        line.to_owned()
    })
}

/// The keyword, the builder flags, and the rest of the text.
fn split_command(line: &str, escape: char) -> (String, Vec<String>, String) {
    let trimmed = line.trim_matches(is_python_space);
    let Some(start) = trimmed.find(is_ascii_blank) else {
        return (trimmed.to_owned(), Vec::new(), String::new());
    };
    let after = trimmed[start..].trim_start_matches(is_ascii_blank);
    let (rest, flags) = builder_flags(after, escape);
    (
        trimmed[..start].to_owned(),
        flags,
        rest.trim_matches(is_python_space).to_owned(),
    )
}

/// The leading `--flag[=value]` words (quotes and escapes resolved), up to the first other
/// word or a lone `--`; the text from there.
pub(super) fn builder_flags(line: &str, escape: char) -> (String, Vec<String>) {
    #[derive(PartialEq)]
    enum Phase {
        Spaces,
        Word,
        Quoted(char),
    }
    let chars: Vec<char> = line.chars().collect();
    let rest_from = |pos: usize| chars[pos..].iter().collect::<String>();
    let mut flags = Vec::new();
    let mut phase = Phase::Spaces;
    let mut word = String::new();
    let mut quoted_empty = false;
    let mut pos = 0;
    loop {
        let c = chars.get(pos).copied();
        if phase == Phase::Spaces {
            let Some(c) = c else {
                break;
            };
            if is_space(c) {
                pos += 1;
                continue;
            }
            if c != '-' || chars.get(pos + 1) != Some(&'-') {
                return (rest_from(pos), flags);
            }
            phase = Phase::Word;
        }
        let Some(c) = c else {
            if word != "--" && (quoted_empty || !word.is_empty()) {
                flags.push(word);
            }
            break;
        };
        match phase {
            Phase::Word => {
                if is_space(c) {
                    if word == "--" {
                        return (rest_from(pos), flags);
                    }
                    if quoted_empty || !word.is_empty() {
                        flags.push(std::mem::take(&mut word));
                    }
                    word.clear();
                    quoted_empty = false;
                    phase = Phase::Spaces;
                    pos += 1;
                    continue;
                }
                if c == '\'' || c == '"' {
                    quoted_empty = true;
                    phase = Phase::Quoted(c);
                    pos += 1;
                    continue;
                }
                if c == escape {
                    pos += 1;
                    if let Some(next) = chars.get(pos) {
                        word.push(*next);
                        pos += 1;
                    }
                    continue;
                }
                word.push(c);
                pos += 1;
            }
            Phase::Quoted(quote) => {
                if c == quote {
                    phase = Phase::Word;
                    pos += 1;
                    continue;
                }
                if c == escape {
                    pos += 1;
                    match chars.get(pos) {
                        Some(next) => {
                            word.push(*next);
                            pos += 1;
                        }
                        None => phase = Phase::Word,
                    }
                    continue;
                }
                word.push(c);
                pos += 1;
            }
            Phase::Spaces => {}
        }
    }
    (String::new(), flags)
}

/// The arguments of an instruction by its keyword's rules; an unknown keyword is an error.
fn arguments(
    name: &str,
    command: &str,
    rest: &str,
    escape: char,
) -> Result<(Vec<String>, Form), String> {
    let shell = |args: Vec<String>| Ok((args, Form::Shell));
    match name {
        "ADD" | "COPY" => match json_array(rest)? {
            Some(args) => Ok((args, Form::Json)),
            None => shell(words(rest, escape)),
        },
        "ARG" => shell(words(rest, escape)),
        "CMD" | "ENTRYPOINT" | "RUN" | "SHELL" => maybe_json(rest),
        "ENV" | "LABEL" => shell(name_values(name, rest, escape)?),
        "EXPOSE" | "FROM" => shell(split_blanks(rest)),
        "HEALTHCHECK" => {
            let kind_len = rest.find(is_space).unwrap_or(rest.len());
            if kind_len == 0 {
                return shell(Vec::new());
            }
            let (kind, command) = rest.split_at(kind_len);
            let (mut args, form) = maybe_json(command.trim_start_matches(is_space))?;
            args.insert(0, kind.to_owned());
            Ok((args, form))
        }
        "MAINTAINER" | "STOPSIGNAL" | "USER" | "WORKDIR" => shell(if rest.is_empty() {
            Vec::new()
        } else {
            vec![rest.to_owned()]
        }),
        "ONBUILD" => shell(Vec::new()),
        "VOLUME" => match json_array(rest)? {
            Some(args) => Ok((args, Form::Json)),
            None => shell(split_blanks(rest)),
        },
        _ => Err(format!("unknown instruction {command}")),
    }
}

/// The text split at runs of `[\t\v\f\r ]` (nothing for an empty text).
fn split_blanks(rest: &str) -> Vec<String> {
    if rest.is_empty() {
        return Vec::new();
    }
    let mut out = vec![String::new()];
    let mut in_blanks = false;
    for c in rest.chars() {
        if is_ascii_blank(c) {
            if !in_blanks {
                out.push(String::new());
            }
            in_blanks = true;
        } else {
            in_blanks = false;
            if let Some(word) = out.last_mut() {
                word.push(c);
            }
        }
    }
    out
}

/// The JSON form, or the whole text as one argument.
fn maybe_json(rest: &str) -> Result<(Vec<String>, Form), String> {
    if rest.is_empty() {
        return Ok((Vec::new(), Form::Shell));
    }
    Ok(match json_array(rest)? {
        Some(args) => (args, Form::Json),
        None => (vec![rest.to_owned()], Form::Shell),
    })
}

/// `Some` for a JSON array of strings, `None` for text that is no JSON array; an array with
/// anything but strings in it is an error.
fn json_array(rest: &str) -> Result<Option<Vec<String>>, String> {
    let rest = trim_leading_space(rest);
    if !rest.starts_with('[') {
        return Ok(None);
    }
    let Ok(serde_json::Value::Array(items)) = serde_json::from_str::<serde_json::Value>(rest)
    else {
        return Ok(None);
    };
    items
        .into_iter()
        .map(|item| match item {
            serde_json::Value::String(text) => Ok(text),
            other => Err(format!(
                "the JSON form takes strings only, and {other} is not one"
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `ENV a=b c=d` as `[a, b, =, c, d, =]`; `ENV a b c` as `[a, b c, ""]`.
fn name_values(keyword: &str, rest: &str, escape: char) -> Result<Vec<String>, String> {
    let words = words(rest, escape);
    let Some(first) = words.first() else {
        return Ok(Vec::new());
    };
    if !first.contains('=') {
        let Some(start) = rest.find(is_ascii_blank) else {
            return Err(format!("{keyword} needs a name and a value"));
        };
        let value = rest[start..].trim_start_matches(is_ascii_blank);
        return Ok(vec![
            rest[..start].to_owned(),
            value.to_owned(),
            String::new(),
        ]);
    }
    let mut args = Vec::with_capacity(words.len() * 3);
    for word in &words {
        let Some((name, value)) = word.split_once('=') else {
            return Err(format!(
                "{keyword} mixes forms: {word:?} has no '=' (write name=value)"
            ));
        };
        args.extend([name.to_owned(), value.to_owned(), "=".to_owned()]);
    }
    Ok(args)
}

/// The text split at unquoted blanks, quotes and escapes kept for the later reading of each
/// word (so `COPY "my file" /x/` has two words).
pub(super) fn words(rest: &str, escape: char) -> Vec<String> {
    #[derive(PartialEq)]
    enum Phase {
        Spaces,
        Word,
        Quoted(char),
    }
    let chars: Vec<char> = rest.chars().collect();
    let mut words = Vec::new();
    let mut phase = Phase::Spaces;
    let mut word = String::new();
    let mut quoted_empty = false;
    let mut pos = 0;
    loop {
        let c = chars.get(pos).copied();
        if phase == Phase::Spaces {
            let Some(c) = c else {
                break;
            };
            if is_space(c) {
                pos += 1;
                continue;
            }
            phase = Phase::Word;
        }
        let Some(c) = c else {
            if quoted_empty || !word.is_empty() {
                words.push(word);
            }
            break;
        };
        match phase {
            Phase::Word => {
                if is_space(c) {
                    if quoted_empty || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    quoted_empty = false;
                    phase = Phase::Spaces;
                    pos += 1;
                    continue;
                }
                if c == '\'' || c == '"' {
                    quoted_empty = true;
                    phase = Phase::Quoted(c);
                }
                if c == escape {
                    pos += 1;
                    // Outside quotes the escape and what it escapes (a quote too) stay.
                    if let Some(next) = chars.get(pos) {
                        word.push(c);
                        word.push(*next);
                        pos += 1;
                    }
                    continue;
                }
                word.push(c);
                pos += 1;
            }
            Phase::Quoted(quote) => {
                if c == quote {
                    phase = Phase::Word;
                }
                if c == escape && quote != '\'' {
                    pos += 1;
                    match chars.get(pos) {
                        Some(next) => {
                            word.push(c);
                            word.push(*next);
                            pos += 1;
                        }
                        None => phase = Phase::Word,
                    }
                    continue;
                }
                word.push(c);
                pos += 1;
            }
            Phase::Spaces => {}
        }
    }
    words
}

/// The heredoc markers among the words of an instruction's line.
fn heredocs_in_line(line: &str) -> Result<Vec<Heredoc>, String> {
    let lexer = Lexer {
        escape: '\\',
        quotes: Quotes::Keep,
        escapes: Escapes::Keep,
        variables: Variables::Keep,
    };
    // A line the shell rules cannot read has no heredocs.
    let Ok(words) = lexer.words(line) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for word in words {
        found.extend(heredoc_marker(&word)?);
    }
    Ok(found)
}

/// `[fd]<<[-]NAME` as a heredoc (its body still empty); `None` for any other word. A quoted
/// (part of the) name makes the body literal.
pub(super) fn heredoc_marker(word: &str) -> Result<Option<Heredoc>, String> {
    let after_fd = word.trim_start_matches(|c: char| c.is_ascii_digit());
    let Some(after) = after_fd.strip_prefix("<<") else {
        return Ok(None);
    };
    let (tabs, after) = match after.strip_prefix('-') {
        Some(after) => (Tabs::Strip, after),
        None => (Tabs::Keep, after),
    };
    let rest = after.trim_start_matches(['\t', '\n', '\x0c', '\r', ' ']);
    if rest.contains('<') || rest.is_empty() {
        return Ok(None);
    }
    let plain = Lexer::keeping_variables('\\').words(rest)?;
    let [name] = plain.as_slice() else {
        return Ok(None);
    };
    let raw = Lexer {
        quotes: Quotes::Keep,
        ..Lexer::keeping_variables('\\')
    }
    .words(rest)?;
    let [raw_name] = raw.as_slice() else {
        return Err(format!(
            "the heredoc marker {word:?} reads as one word and as several"
        ));
    };
    let quotes = |text: &str| text.chars().filter(|c| matches!(c, '\'' | '"')).count();
    let expansion = if quotes(name) == quotes(raw_name) {
        Expansion::Expand
    } else {
        Expansion::Literal
    };
    Ok(Some(Heredoc {
        name: name.clone(),
        content: String::new(),
        tabs,
        expansion,
    }))
}
