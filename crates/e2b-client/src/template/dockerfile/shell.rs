//! The shell-word reading a Dockerfile's arguments go through (BuildKit's rules, as the SDK
//! ports them): quotes and the escape character are resolved, `$VAR` / `${VAR…}` references
//! are either kept verbatim (for the sandbox's shell to expand at build time) or replaced
//! from the variables the Dockerfile declared so far.

use std::collections::HashMap;

/// How deep `${…}` references may nest before the word is refused (a stack guard).
const MAX_NESTING: usize = 64;

/// Characters that are a whole parameter name on their own (`$@`, `$?`, …).
const SPECIAL_PARAMETERS: &str = "@*#?-$!0";

/// Go's `unicode.IsSpace`, which BuildKit splits words on: Rust's whitespace is the same set.
pub(super) fn is_space(c: char) -> bool {
    c.is_whitespace()
}

/// Whether quote characters stay in what is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Quotes {
    /// Removed, as a shell does.
    Strip,
    /// Kept (to tell a quoted heredoc delimiter from a bare one).
    Keep,
}

/// Whether escape characters stay in what is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Escapes {
    /// Removed; the escaped character stays.
    Strip,
    /// Kept with the character they escape.
    Keep,
}

/// What a variable reference becomes.
#[derive(Clone, Copy, Debug)]
pub(super) enum Variables<'v> {
    /// Kept as written, for the shell of the build to expand.
    Keep,
    /// Replaced by its value; an undeclared variable is empty.
    Resolve(&'v HashMap<String, String>),
}

/// One configuration of the reader.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lexer<'v> {
    /// The Dockerfile's escape character (`\`, or `` ` `` by a directive).
    pub(super) escape: char,
    /// Quote handling.
    pub(super) quotes: Quotes,
    /// Escape handling.
    pub(super) escapes: Escapes,
    /// Variable handling.
    pub(super) variables: Variables<'v>,
}

impl Lexer<'static> {
    /// Quotes and escapes resolved, references kept: how instruction arguments are read.
    pub(super) fn keeping_variables(escape: char) -> Lexer<'static> {
        Lexer {
            escape,
            quotes: Quotes::Strip,
            escapes: Escapes::Strip,
            variables: Variables::Keep,
        }
    }
}

impl Lexer<'_> {
    /// The word with quotes and escapes resolved; whitespace stays.
    pub(super) fn word(&self, text: &str) -> Result<String, String> {
        Ok(self.read(text)?.0)
    }

    /// The text split into words at unquoted whitespace.
    pub(super) fn words(&self, text: &str) -> Result<Vec<String>, String> {
        Ok(self.read(text)?.1)
    }

    fn read(&self, text: &str) -> Result<(String, Vec<String>), String> {
        let mut reader = Reader {
            lexer: *self,
            chars: text.chars().collect(),
            pos: 0,
            escapes: self.escapes,
            depth: 0,
        };
        reader
            .until(None, self.escapes)
            .map_err(|reason| format!("cannot read {text:?}: {reason}"))
    }
}

/// Words as they are read: a character added raw joins the current word, whitespace added
/// as text ends it.
#[derive(Debug, Default)]
struct Words {
    done: Vec<String>,
    /// `None` between words; `Some("")` is an empty word (`''`).
    current: Option<String>,
}

impl Words {
    fn add_char(&mut self, c: char) {
        if is_space(c) {
            if let Some(word) = self.current.take() {
                self.done.push(word);
            }
        } else {
            self.add_raw_char(c);
        }
    }

    fn add_raw_char(&mut self, c: char) {
        self.current.get_or_insert_with(String::new).push(c);
    }

    fn add_text(&mut self, text: &str) {
        text.chars().for_each(|c| self.add_char(c));
    }

    fn add_raw_text(&mut self, text: &str) {
        self.current.get_or_insert_with(String::new).push_str(text);
    }

    fn finish(mut self) -> Vec<String> {
        self.done.extend(self.current.take());
        self.done
    }
}

struct Reader<'v> {
    lexer: Lexer<'v>,
    chars: Vec<char>,
    pos: usize,
    escapes: Escapes,
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += 1;
        Some(c)
    }

    fn at_end(&self) -> bool {
        self.pos >= self.chars.len()
    }

    fn keeping(&self) -> bool {
        matches!(self.lexer.variables, Variables::Keep)
    }

    fn lookup(&self, name: &str) -> Option<String> {
        match self.lexer.variables {
            Variables::Keep => None,
            Variables::Resolve(vars) => vars.get(name).cloned(),
        }
    }

    /// Reads up to `stop` (consumed) or the end; the text and its words.
    fn until(
        &mut self,
        stop: Option<char>,
        escapes: Escapes,
    ) -> Result<(String, Vec<String>), String> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err("references nest too deeply".to_owned());
        }
        let outer = std::mem::replace(&mut self.escapes, escapes);
        let read = self.until_inner(stop);
        self.escapes = outer;
        self.depth -= 1;
        read
    }

    fn until_inner(&mut self, stop: Option<char>) -> Result<(String, Vec<String>), String> {
        let mut text = String::new();
        let mut words = Words::default();
        while let Some(c) = self.peek() {
            if Some(c) == stop {
                self.pos += 1;
                return Ok((text, words.finish()));
            }
            let special = match c {
                '$' => Some(self.reference()?),
                '<' => Some(self.angle()),
                '\'' => Some(self.single_quoted()?),
                '"' => Some(self.double_quoted()?),
                _ => None,
            };
            if let Some(piece) = special {
                if c == '$' {
                    words.add_text(&piece);
                } else {
                    words.add_raw_text(&piece);
                }
                text.push_str(&piece);
                continue;
            }
            self.pos += 1;
            if c == self.lexer.escape {
                if self.escapes == Escapes::Keep {
                    words.add_raw_char(c);
                    text.push(c);
                }
                // An escape character at the very end escapes nothing and goes.
                let Some(escaped) = self.next() else {
                    break;
                };
                words.add_raw_char(escaped);
                text.push(escaped);
            } else {
                words.add_char(c);
                text.push(c);
            }
        }
        match stop {
            Some(stop) => Err(format!("no closing '{stop}' before the end")),
            None => Ok((text, words.finish())),
        }
    }

    /// `'…'`: everything literal up to the next single quote.
    fn single_quoted(&mut self) -> Result<String, String> {
        self.pos += 1;
        let keep = self.lexer.quotes == Quotes::Keep;
        let mut text = String::new();
        if keep {
            text.push('\'');
        }
        loop {
            match self.next() {
                None => return Err("a single quote is not closed".to_owned()),
                Some('\'') => {
                    if keep {
                        text.push('\'');
                    }
                    return Ok(text);
                }
                Some(c) => text.push(c),
            }
        }
    }

    /// `"…"`: literal but for references, and the escape character before `"`, `$` or
    /// itself.
    fn double_quoted(&mut self) -> Result<String, String> {
        self.pos += 1;
        let keep = self.lexer.quotes == Quotes::Keep;
        let mut text = String::new();
        if keep {
            text.push('"');
        }
        loop {
            match self.peek() {
                None => return Err("a double quote is not closed".to_owned()),
                Some('"') => {
                    self.pos += 1;
                    if keep {
                        text.push('"');
                    }
                    return Ok(text);
                }
                Some('$') => {
                    let piece = self.reference()?;
                    text.push_str(&piece);
                    continue;
                }
                Some(_) => {}
            }
            let mut c = self.next().unwrap_or_default();
            if c == self.lexer.escape {
                if self.escapes == Escapes::Keep {
                    text.push(c);
                }
                match self.peek() {
                    // Nothing follows: the unclosed quote is reported next round.
                    None => continue,
                    Some(after) if after == '"' || after == '$' || after == self.lexer.escape => {
                        c = after;
                        self.pos += 1;
                    }
                    Some(_) => {}
                }
            }
            text.push(c);
        }
    }

    /// `<`, or `<<` with the blanks after it (a heredoc marker stays one word).
    fn angle(&mut self) -> String {
        self.pos += 1;
        if self.peek() != Some('<') {
            return "<".to_owned();
        }
        self.pos += 1;
        let mut marker = "<<".to_owned();
        while let Some(c @ ('\t' | '\r' | ' ')) = self.peek() {
            marker.push(c);
            self.pos += 1;
        }
        marker
    }

    /// A parameter name: a run of digits, one special character, or letters, digits and
    /// `_`.
    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if name.is_empty() && c.is_ascii_digit() {
                while let Some(digit) = self.peek().filter(char::is_ascii_digit) {
                    name.push(digit);
                    self.pos += 1;
                }
                return name;
            }
            if name.is_empty() && SPECIAL_PARAMETERS.contains(c) {
                self.pos += 1;
                return c.to_string();
            }
            if !c.is_alphanumeric() && c != '_' {
                break;
            }
            name.push(c);
            self.pos += 1;
        }
        name
    }

    /// `$NAME` or `${NAME…}`, at a `$`.
    fn reference(&mut self) -> Result<String, String> {
        self.pos += 1;
        if self.peek() != Some('{') {
            let name = self.name();
            if name.is_empty() {
                return Ok("$".to_owned());
            }
            return Ok(match self.lookup(&name) {
                Some(value) => value,
                None if self.keeping() => format!("${name}"),
                None => String::new(),
            });
        }
        self.pos += 1;
        match self.peek() {
            None => return Err("a '${' is not closed".to_owned()),
            Some('{' | '}' | ':') => return Err("bad substitution".to_owned()),
            Some(_) => {}
        }
        let name = self.name();
        let Some(first) = self.next() else {
            return Err("a '${' is not closed".to_owned());
        };
        let value = self.lookup(&name);
        if first == '}' {
            return Ok(match value {
                Some(value) => value,
                None if self.keeping() => format!("${{{name}}}"),
                None => String::new(),
            });
        }
        let mut modifier = first.to_string();
        let mut op = first;
        let colon = first == ':';
        if colon {
            let Some(second) = self.next() else {
                return Err("a '${' is not closed".to_owned());
            };
            op = second;
            modifier.push(second);
        } else if op == '/' {
            return self.replacement(&name);
        } else if !"+-?#%".contains(op) {
            return Err(format!("the modifier '{modifier}' is not supported"));
        }
        let pattern = matches!(op, '#' | '%');
        if colon && pattern {
            return Err(format!("the modifier '{modifier}' is not supported"));
        }
        let escapes = if pattern {
            Escapes::Keep
        } else {
            Escapes::Strip
        };
        let word = self.until_brace(escapes)?;
        let Some(value) = value else {
            if self.keeping() {
                return Ok(format!("${{{name}{modifier}{word}}}"));
            }
            return self.apply(&name, op, colon, None, word);
        };
        self.apply(&name, op, colon, Some(value), word)
    }

    /// `${NAME<op>WORD}` with the variable's value known (or known unset).
    fn apply(
        &self,
        name: &str,
        op: char,
        colon: bool,
        value: Option<String>,
        word: String,
    ) -> Result<String, String> {
        let unset = value
            .as_deref()
            .is_none_or(|value| colon && value.is_empty());
        match op {
            '-' => Ok(if unset {
                word
            } else {
                value.unwrap_or_default()
            }),
            '+' => Ok(if unset { String::new() } else { word }),
            '?' => match value {
                Some(value) if !unset => Ok(value),
                Some(_) if word.is_empty() => Err(format!("{name} must not be empty")),
                None if word.is_empty() => Err(format!("{name} must be set")),
                _ => Err(format!("{name}: {word}")),
            },
            '#' | '%' => {
                let value = value.unwrap_or_default();
                let longest = word.starts_with(op);
                let pattern = if longest { &word[1..] } else { &word[..] };
                let stars = if longest {
                    Stars::Longest
                } else {
                    Stars::Shortest
                };
                if op == '#' {
                    trim_prefix(pattern, &value, stars)
                } else {
                    trim_suffix(pattern, &value, stars)
                }
            }
            _ => Err(format!("the modifier '{op}' is not supported")),
        }
    }

    /// `${NAME/PATTERN/STRING}` or `${NAME//PATTERN/STRING}`, after the first `/`.
    fn replacement(&mut self, name: &str) -> Result<String, String> {
        let every = self.peek() == Some('/');
        if every {
            self.pos += 1;
        }
        let pattern = match self.until(Some('/'), Escapes::Keep) {
            Ok((pattern, _)) => pattern,
            Err(_) if self.at_end() => return Err("a '${…/' has no second '/'".to_owned()),
            Err(error) => return Err(error),
        };
        let with = self.until_brace(Escapes::Keep)?;
        let op = if every { "//" } else { "/" };
        let Some(value) = self.lookup(name) else {
            if self.keeping() {
                return Ok(format!("${{{name}{op}{pattern}/{with}}}"));
            }
            return replace(&pattern, "", &with, every);
        };
        replace(&pattern, &value, &with, every)
    }

    fn until_brace(&mut self, escapes: Escapes) -> Result<String, String> {
        match self.until(Some('}'), escapes) {
            Ok((word, _)) => Ok(word),
            Err(_) if self.at_end() => Err("a '${' is not closed".to_owned()),
            Err(error) => Err(error),
        }
    }
}

/// Which run a `*` of a pattern takes when several would match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stars {
    Shortest,
    Longest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// `*`: any run of characters but a newline.
    Star,
    /// `?`: one character but a newline.
    One,
    Literal(char),
}

/// A shell pattern of a `${…}` substitution: `*`, `?`, and `\` before `*`, `?` or `\` for
/// the character itself (before `}` or `/`, it only kept that character in the word).
/// Bracket expressions are literal, as in BuildKit.
fn tokens(pattern: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        match c {
            '*' => out.push(Token::Star),
            '?' => out.push(Token::One),
            '\\' => match chars.get(i).copied() {
                Some('}' | '/') => {}
                Some(next @ ('*' | '?' | '\\')) => {
                    i += 1;
                    out.push(Token::Literal(next));
                }
                next => {
                    let shown = next.map(String::from).unwrap_or_default();
                    return Err(format!(
                        "the pattern {pattern:?} has an escape '\\{shown}' that is not allowed"
                    ));
                }
            },
            c => out.push(Token::Literal(c)),
        }
    }
    Ok(out)
}

/// Where a match of `tokens` starting at `start` ends, choosing among the possible runs of
/// each `*` in the order of `stars` (as a backtracking matcher would), or `None`.
fn match_at(tokens: &[Token], text: &[char], start: usize, stars: Stars) -> Option<usize> {
    // (token, position) → outcome: each state is solved once.
    let width = text.len() + 1;
    let mut memo: Vec<Option<Option<usize>>> = vec![None; (tokens.len() + 1) * width];
    fn solve(
        tokens: &[Token],
        text: &[char],
        t: usize,
        pos: usize,
        stars: Stars,
        memo: &mut Vec<Option<Option<usize>>>,
    ) -> Option<usize> {
        let width = text.len() + 1;
        if let Some(known) = memo[t * width + pos] {
            return known;
        }
        let found = match tokens.get(t) {
            None => Some(pos),
            Some(Token::Literal(c)) => (text.get(pos) == Some(c))
                .then(|| solve(tokens, text, t + 1, pos + 1, stars, memo))
                .flatten(),
            Some(Token::One) => text
                .get(pos)
                .filter(|c| **c != '\n')
                .and_then(|_| solve(tokens, text, t + 1, pos + 1, stars, memo)),
            Some(Token::Star) => {
                let run = text[pos..].iter().take_while(|c| **c != '\n').count();
                let mut ends: Box<dyn Iterator<Item = usize>> = match stars {
                    Stars::Longest => Box::new((pos..=pos + run).rev()),
                    Stars::Shortest => Box::new(pos..=pos + run),
                };
                ends.find_map(|end| solve(tokens, text, t + 1, end, stars, memo))
            }
        };
        memo[t * width + pos] = Some(found);
        found
    }
    solve(tokens, text, 0, start, stars, &mut memo)
}

/// `${NAME#PATTERN}` / `${NAME##PATTERN}`: the value without the pattern's match at its
/// start.
fn trim_prefix(pattern: &str, value: &str, stars: Stars) -> Result<String, String> {
    let tokens = tokens(pattern)?;
    let text: Vec<char> = value.chars().collect();
    Ok(match match_at(&tokens, &text, 0, stars) {
        Some(end) => text[end..].iter().collect(),
        None => value.to_owned(),
    })
}

/// `${NAME%PATTERN}` / `${NAME%%PATTERN}`: the value without the pattern's match at its
/// end, found as a match at the start of both reversed (an escape stays with the character
/// it escapes).
fn trim_suffix(pattern: &str, value: &str, stars: Stars) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut units: Vec<String> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' && i + 1 < chars.len() {
            units.push(chars[i..i + 2].iter().collect());
            i += 2;
        } else {
            units.push(chars[i].to_string());
            i += 1;
        }
    }
    let reversed_pattern: String = units.iter().rev().map(String::as_str).collect();
    let reversed_value: String = value.chars().rev().collect();
    let trimmed = trim_prefix(&reversed_pattern, &reversed_value, stars)?;
    Ok(trimmed.chars().rev().collect())
}

/// `${NAME/PATTERN/STRING}`: the first (or, for `every`, each) match of the pattern, longest
/// runs first, replaced. As Python's `re.sub` (3.7 and later): after an empty match the next
/// may not be empty at the same place, but may directly follow a longer one.
fn replace(pattern: &str, value: &str, with: &str, every: bool) -> Result<String, String> {
    let tokens = tokens(pattern)?;
    let text: Vec<char> = value.chars().collect();
    let mut out = String::new();
    let mut copied = 0;
    let mut from = 0;
    let mut no_empty_at = None;
    while from <= text.len() {
        let found = (from..=text.len()).find_map(|start| {
            let end = match_at(&tokens, &text, start, Stars::Longest)?;
            (no_empty_at != Some(start) || end > start).then_some((start, end))
        });
        let Some((start, end)) = found else {
            break;
        };
        out.extend(&text[copied..start]);
        out.push_str(with);
        copied = end;
        no_empty_at = (end == start).then_some(end);
        from = end;
        if !every {
            break;
        }
    }
    out.extend(&text[copied..]);
    Ok(out)
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
