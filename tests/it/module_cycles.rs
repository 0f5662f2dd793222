//! No module circles, Rust or Python: the file modules of every crate (each target's module
//! tree: `src/lib.rs`, `src/main.rs`, `src/bin/*`, `examples/*`, `tests/*`, `benches/*`,
//! `fuzz/fuzz_targets/*`, of the root package and of every package under `crates/`) and the
//! modules of the Python package `crates/hermes-binding/python/hermes_e2b` must form a DAG.
//! A circle is two or more modules that need each other; each is a design knot (no module of
//! it can be read, tested or moved alone), so this test fails listing every one.
//!
//! The graph. A node is one file module (`foo.rs`, `foo/mod.rs`, a crate root; a `.py` file,
//! a package's `__init__.py`). An edge A -> B is A naming B or an item in B:
//! - Rust: a path in a `use` tree (`crate::b::X`, `super::b`, `self::b`, groups such as
//!   `crate::{a, b::c}`), or a path in code (`crate::b::f()`, `super::b::X`, `b::f()` where
//!   `b` is a child module), through `#[path]` modules too. A path resolves to the deepest
//!   file module it names (`crate::a::b::X` is `a/b.rs` when that file is a module, else
//!   `a.rs`); inline modules (`mod tests { .. }`) belong to their file. Paths into other
//!   crates are not edges: Cargo already keeps crates acyclic.
//! - Python: `from . import x`, `from .x import y`, `from ..p import x`, `import hermes_e2b.x`,
//!   `from hermes_e2b.x import y`, wherever they stand: an import inside a function (a lazy
//!   import) or under `if TYPE_CHECKING:` is still an edge, since it still means the two
//!   modules need each other. `from . import name` is an edge to the submodule `name` when
//!   there is one, else to the package.
//!
//! The two languages are one graph: a Python module importing the package's extension
//! (`from . import _native`) is an edge to the Rust crate root that builds it, and a Rust
//! module importing a Python module by name (`py.import("hermes_e2b.x")`) an edge to it.
//!
//! The rule for parents and children: a module's edge to one of its ancestors is not
//! counted: a child may use what its enclosing modules define for all their children (the
//! crate's `Error`, shared constants, `use super::*` in a test module). That is the
//! enclosing scope, not a circle. Everything else counts, a parent's use of its own child
//! included (a parent that re-exports or calls its child needs it), so siblings that use each
//! other, directly or around a ring, cousins in different directories, and a module outside
//! a directory that uses it while something inside uses that module back, are circles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One file module of a module tree.
#[derive(Debug)]
struct Node {
    /// The file, as reported (relative to the scanned root when possible).
    file: PathBuf,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
}

/// The module graph of a set of module trees (Rust targets, or one Python package).
#[derive(Debug, Default)]
struct Graph {
    nodes: Vec<Node>,
    /// A -> B, with where A names B first (line and the text), for the report.
    edges: BTreeMap<usize, BTreeMap<usize, (usize, String)>>,
    /// Python modules a Rust module imports by name (`py.import("pkg.x")`): the module, the
    /// line and the dotted name, resolved once the Python package is in the graph.
    python_imports: Vec<(usize, usize, String)>,
}

impl Graph {
    fn add_node(&mut self, file: PathBuf, parent: Option<usize>) -> usize {
        self.nodes.push(Node {
            file,
            parent,
            children: BTreeMap::new(),
        });
        self.nodes.len() - 1
    }

    fn is_ancestor(&self, ancestor: usize, mut node: usize) -> bool {
        while let Some(parent) = self.nodes[node].parent {
            if parent == ancestor {
                return true;
            }
            node = parent;
        }
        false
    }

    /// Records A -> B unless it is a self edge or B encloses A (see the module docs).
    fn add_edge(&mut self, from: usize, to: usize, line: usize, text: String) {
        if from == to || self.is_ancestor(to, from) {
            return;
        }
        self.edges
            .entry(from)
            .or_default()
            .entry(to)
            .or_insert((line, text));
    }

    /// Every circle: each strongly connected component of two or more modules, as one
    /// shortest ring through its first member (closed by that member again) and all its
    /// members (a knot of several rings is one circle).
    fn cycles(&self) -> Vec<(Vec<usize>, BTreeSet<usize>)> {
        let mut circles = Vec::new();
        for component in self.components().into_iter().filter(|c| c.len() > 1) {
            let members: BTreeSet<usize> = component.iter().copied().collect();
            let start = *members
                .iter()
                .min_by_key(|n| &self.nodes[**n].file)
                .unwrap();
            circles.push((self.shortest_ring(start, &members), members));
        }
        circles.sort_by_key(|(ring, _)| self.nodes[ring[0]].file.clone());
        circles
    }

    fn successors(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        self.edges
            .get(&node)
            .into_iter()
            .flat_map(|targets| targets.keys().copied())
    }

    /// Tarjan's algorithm, iterative (module trees are shallow, but no recursion limits).
    fn components(&self) -> Vec<Vec<usize>> {
        let n = self.nodes.len();
        let mut index = vec![usize::MAX; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut next = 0;
        let mut out = Vec::new();
        for root in 0..n {
            if index[root] != usize::MAX {
                continue;
            }
            let mut work: Vec<(usize, Vec<usize>)> = Vec::new();
            index[root] = next;
            low[root] = next;
            next += 1;
            stack.push(root);
            on_stack[root] = true;
            work.push((root, self.successors(root).collect()));
            while let Some((node, pending)) = work.last_mut() {
                let node = *node;
                if let Some(succ) = pending.pop() {
                    if index[succ] == usize::MAX {
                        index[succ] = next;
                        low[succ] = next;
                        next += 1;
                        stack.push(succ);
                        on_stack[succ] = true;
                        work.push((succ, self.successors(succ).collect()));
                    } else if on_stack[succ] {
                        low[node] = low[node].min(index[succ]);
                    }
                } else {
                    work.pop();
                    if let Some((parent, _)) = work.last() {
                        low[*parent] = low[*parent].min(low[node]);
                    }
                    if low[node] == index[node] {
                        let mut component = Vec::new();
                        while let Some(member) = stack.pop() {
                            on_stack[member] = false;
                            component.push(member);
                            if member == node {
                                break;
                            }
                        }
                        out.push(component);
                    }
                }
            }
        }
        out
    }

    /// A shortest path from `start` back to itself inside `members` (breadth first).
    fn shortest_ring(&self, start: usize, members: &BTreeSet<usize>) -> Vec<usize> {
        let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(node) = queue.pop_front() {
            for succ in self.successors(node).filter(|s| members.contains(s)) {
                if succ == start {
                    let mut ring = vec![start, node];
                    let mut at = node;
                    while at != start {
                        at = came_from[&at];
                        ring.push(at);
                    }
                    ring.reverse();
                    return ring;
                }
                if let std::collections::btree_map::Entry::Vacant(entry) = came_from.entry(succ) {
                    entry.insert(node);
                    queue.push_back(succ);
                }
            }
        }
        unreachable!("a strongly connected component has a ring through each member")
    }

    /// The report of one circle: the ring, each step's first reference, and the other
    /// members when there are more.
    fn describe(&self, ring: &[usize], members: &BTreeSet<usize>) -> String {
        let names: Vec<String> = ring
            .iter()
            .map(|n| self.nodes[*n].file.display().to_string())
            .collect();
        let mut text = names.join(" -> ");
        for pair in ring.windows(2) {
            let (line, what) = &self.edges[&pair[0]][&pair[1]];
            text.push_str(&format!(
                "\n    {}:{line}: {what}",
                self.nodes[pair[0]].file.display()
            ));
        }
        if members.len() + 1 > ring.len() {
            let mut all: Vec<String> = members
                .iter()
                .map(|n| self.nodes[*n].file.display().to_string())
                .collect();
            all.sort();
            text.push_str(&format!(
                "\n    all {} modules of this circle: {}",
                all.len(),
                all.join(", ")
            ));
        }
        text
    }
}

// ---------------------------------------------------------------------------------------
// Rust

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
    Str(String),
}

/// Tokens with their line numbers; comments, char literals, lifetimes and numbers dropped.
fn rust_tokens(source: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let ident_char = |c: char| c == '_' || c.is_alphanumeric();
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"'
            || ((c == 'b' || c == 'c') && next == Some('"'))
            || ((c == 'r' || c == 'b' || c == 'c') && matches!(next, Some('#') | Some('r')) && {
                // r"..", r#".."#, br"..", br#".."#, cr".."
                let mut j = i + 1;
                if chars[j] == 'r' {
                    j += 1;
                }
                while chars.get(j) == Some(&'#') {
                    j += 1;
                }
                chars.get(j) == Some(&'"') && (c == 'r' || chars[i + 1] == 'r')
            })
        {
            let start_line = line;
            let mut j = i;
            let mut raw = false;
            while chars[j] != '"' && chars[j] != '#' {
                raw |= chars[j] == 'r';
                j += 1;
            }
            let mut hashes = 0;
            while chars[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            let mut text = String::new();
            while j < chars.len() {
                let d = chars[j];
                if d == '\n' {
                    line += 1;
                }
                if !raw && d == '\\' {
                    if let Some(escaped) = chars.get(j + 1) {
                        if *escaped == '\n' {
                            line += 1;
                        }
                        text.push(*escaped);
                    }
                    j += 2;
                    continue;
                }
                if d == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                text.push(d);
                j += 1;
            }
            out.push((Tok::Str(text), start_line));
            i = j;
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime / label ('a).
            if next == Some('\\') {
                // Past the quote, the backslash and the escaped char ('\'' included).
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c == 'r' && next == Some('#') && chars.get(i + 2).is_some_and(|d| ident_char(*d))
        {
            let start = i + 2;
            i = start;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                // `1..2` and `x.0.1`: a range's dots end the number.
                if chars[i] == '.' && chars.get(i + 1) == Some(&'.') {
                    break;
                }
                i += 1;
            }
        } else if ident_char(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && next == Some(':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// Where a reference stands: its file module and the inline modules around it.
#[derive(Debug, Clone, Copy)]
struct Scope {
    node: usize,
    inline_depth: usize,
}

/// Expands a `use` tree (tokens after `use`, up to `;`) into its paths.
fn use_paths(tokens: &[Tok]) -> Vec<Vec<String>> {
    fn tree(tokens: &[Tok], at: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            match tokens.get(*at) {
                Some(Tok::Ident(name)) if name == "as" => {
                    *at += 2; // `as name`
                    out.push(path);
                    return;
                }
                Some(Tok::Ident(name)) => {
                    path.push(name.clone());
                    *at += 1;
                }
                Some(Tok::Path) => *at += 1,
                Some(Tok::Punct('*')) => {
                    *at += 1;
                    out.push(path);
                    return;
                }
                Some(Tok::Punct('{')) => {
                    *at += 1;
                    loop {
                        match tokens.get(*at) {
                            Some(Tok::Punct('}')) => {
                                *at += 1;
                                return;
                            }
                            Some(Tok::Punct(',')) => *at += 1,
                            None => return,
                            _ => tree(tokens, at, path.clone(), out),
                        }
                    }
                }
                _ => {
                    out.push(path);
                    return;
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut at = 0;
    // `a::b::{self, C}`: the `self` names `a::b` itself.
    // A leading `::` names an external crate: no edge.
    if tokens.first() != Some(&Tok::Path) {
        tree(tokens, &mut at, Vec::new(), &mut out);
    }
    for path in &mut out {
        if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
    }
    out
}

/// The file module that `path`, named from `scope`, resolves to (None: another crate, or
/// not a module path).
fn resolve_rust(graph: &Graph, scope: Scope, path: &[String]) -> Option<usize> {
    let (mut node, depth, rest) = match path.first().map(String::as_str) {
        Some("crate") => {
            let mut root = scope.node;
            while let Some(parent) = graph.nodes[root].parent {
                root = parent;
            }
            (root, 0, &path[1..])
        }
        Some("self") | Some("super") => {
            let mut node = scope.node;
            let mut depth = scope.inline_depth;
            let mut at = 0;
            while let Some(segment) = path.get(at) {
                match segment.as_str() {
                    "self" => {}
                    "super" if depth > 0 => depth -= 1,
                    "super" => node = graph.nodes[node].parent?,
                    _ => break,
                }
                at += 1;
            }
            (node, depth, &path[at..])
        }
        Some(first)
            if scope.inline_depth == 0 && graph.nodes[scope.node].children.contains_key(first) =>
        {
            (scope.node, 0, path)
        }
        _ => return None,
    };
    // Inside an inline module, names are that module's items (or its inline children).
    if depth > 0 {
        return Some(node);
    }
    for segment in rest {
        match graph.nodes[node].children.get(segment) {
            Some(child) => node = *child,
            None => break,
        }
    }
    Some(node)
}

/// Adds the module tree of the crate root `root_file` and its references to `graph`.
fn add_rust_tree(graph: &mut Graph, base: &Path, root_file: &Path) {
    let root = graph.add_node(relative(base, root_file), None);
    // The files to read: (node, its path, directory of its `mod x;` children).
    let dir = root_file.parent().unwrap().to_path_buf();
    let mut pending = vec![(root, root_file.to_path_buf(), dir)];
    let mut parsed = Vec::new();
    while let Some((node, file, child_dir)) = pending.pop() {
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let tokens = rust_tokens(&source);
        // Declarations first, so paths can resolve into any module of the tree.
        let mut inline = 0usize;
        let mut braces: Vec<bool> = Vec::new(); // per open brace: does it open an inline mod
        let mut path_attr: Option<String> = None;
        for (k, (tok, _)) in tokens.iter().enumerate() {
            match tok {
                Tok::Punct('#') => {
                    if let [
                        (Tok::Punct('['), _),
                        (Tok::Ident(attr), _),
                        (Tok::Punct('='), _),
                        (Tok::Str(p), _),
                        ..,
                    ] = &tokens[k + 1..]
                        && attr == "path"
                    {
                        path_attr = Some(p.clone());
                    }
                }
                Tok::Ident(word) if word == "mod" => {
                    let Some((Tok::Ident(name), _)) = tokens.get(k + 1) else {
                        continue;
                    };
                    match tokens.get(k + 2) {
                        Some((Tok::Punct(';'), _)) if inline == 0 => {
                            let (child_file, grandchild_dir) = match path_attr.take() {
                                Some(p) => {
                                    let f = file.parent().unwrap().join(p);
                                    let d = f.parent().unwrap().to_path_buf();
                                    (f, d)
                                }
                                None => {
                                    let flat = child_dir.join(format!("{name}.rs"));
                                    if flat.exists() {
                                        (flat, child_dir.join(name))
                                    } else {
                                        (child_dir.join(name).join("mod.rs"), child_dir.join(name))
                                    }
                                }
                            };
                            let child = graph.add_node(relative(base, &child_file), Some(node));
                            graph.nodes[node].children.insert(name.clone(), child);
                            pending.push((child, child_file, grandchild_dir));
                        }
                        Some((Tok::Punct('{'), _)) => {
                            path_attr = None;
                        }
                        _ => {}
                    }
                }
                Tok::Punct('{') => {
                    let opens_mod = k >= 2
                        && matches!(&tokens[k - 2].0, Tok::Ident(w) if w == "mod")
                        && matches!(&tokens[k - 1].0, Tok::Ident(_));
                    inline += usize::from(opens_mod);
                    braces.push(opens_mod);
                }
                Tok::Punct('}') => inline -= usize::from(braces.pop() == Some(true)),
                Tok::Punct(';') => path_attr = None,
                _ => {}
            }
        }
        parsed.push((node, tokens));
    }
    for (node, tokens) in parsed {
        add_rust_references(graph, node, &tokens);
    }
}

fn add_rust_references(graph: &mut Graph, node: usize, tokens: &[(Tok, usize)]) {
    let mut braces: Vec<bool> = Vec::new();
    let mut inline = 0usize;
    let mut k = 0;
    while k < tokens.len() {
        let scope = Scope {
            node,
            inline_depth: inline,
        };
        match &tokens[k].0 {
            Tok::Punct('{') => {
                let opens_mod = k >= 2
                    && matches!(&tokens[k - 2].0, Tok::Ident(w) if w == "mod")
                    && matches!(&tokens[k - 1].0, Tok::Ident(_));
                inline += usize::from(opens_mod);
                braces.push(opens_mod);
            }
            Tok::Punct('}') => inline -= usize::from(braces.pop() == Some(true)),
            // `py.import("pkg.x")`: a Python module (`PyModule::import(..)` below).
            Tok::Ident(word) if word == "import" => {
                if let Some(name) = python_import_at(tokens, k) {
                    graph.python_imports.push((node, tokens[k].1, name));
                }
            }
            Tok::Ident(word) if word == "use" => {
                let end = tokens[k..]
                    .iter()
                    .position(|(t, _)| *t == Tok::Punct(';'))
                    .map_or(tokens.len(), |p| k + p);
                let tree: Vec<Tok> = tokens[k + 1..end].iter().map(|(t, _)| t.clone()).collect();
                for path in use_paths(&tree) {
                    if let Some(target) = resolve_rust(graph, scope, &path) {
                        graph.add_edge(
                            node,
                            target,
                            tokens[k].1,
                            format!("use {}", path.join("::")),
                        );
                    }
                }
                k = end;
            }
            Tok::Ident(first)
                if tokens.get(k + 1).map(|t| &t.0) == Some(&Tok::Path)
                    && (k == 0 || tokens[k - 1].0 != Tok::Path) =>
            {
                let mut path = vec![first.clone()];
                let mut j = k + 1;
                while tokens.get(j).map(|t| &t.0) == Some(&Tok::Path) {
                    match tokens.get(j + 1).map(|t| &t.0) {
                        Some(Tok::Ident(segment)) => {
                            path.push(segment.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                if let Some(target) = resolve_rust(graph, scope, &path) {
                    graph.add_edge(node, target, tokens[k].1, path.join("::"));
                }
                if path.last().is_some_and(|last| last == "import")
                    && let Some(name) = python_import_at(tokens, j - 1)
                {
                    graph.python_imports.push((node, tokens[k].1, name));
                }
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
}

/// The module name of a call `import("pkg.x")` or `import(py, "pkg.x")` whose `import` is
/// the token at `k`.
fn python_import_at(tokens: &[(Tok, usize)], k: usize) -> Option<String> {
    if tokens.get(k + 1).map(|t| &t.0) != Some(&Tok::Punct('(')) {
        return None;
    }
    match (tokens.get(k + 2), tokens.get(k + 3), tokens.get(k + 4)) {
        (Some((Tok::Str(name), _)), _, _) => Some(name.clone()),
        (Some((Tok::Ident(_), _)), Some((Tok::Punct(','), _)), Some((Tok::Str(name), _))) => {
            Some(name.clone())
        }
        _ => None,
    }
}

/// The crate roots of the package in `package`: every target Cargo discovers, and fuzz
/// targets.
fn rust_roots(package: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for file in ["src/lib.rs", "src/main.rs", "build.rs"] {
        roots.push(package.join(file));
    }
    for dir in [
        "src/bin",
        "examples",
        "tests",
        "benches",
        "fuzz/fuzz_targets",
    ] {
        let Ok(entries) = std::fs::read_dir(package.join(dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(path);
            } else if path.join("main.rs").exists() {
                roots.push(path.join("main.rs"));
            }
        }
    }
    roots.retain(|r| r.exists());
    roots.sort();
    roots
}

fn rust_graph(base: &Path, packages: &[PathBuf]) -> Graph {
    let mut graph = Graph::default();
    for package in packages {
        for root in rust_roots(package) {
            add_rust_tree(&mut graph, base, &root);
        }
    }
    graph
}

// ---------------------------------------------------------------------------------------
// Python

/// The source with comments and string literals blanked (newlines kept, so line numbers
/// hold), so a docstring's "from . import x" is no import.
fn python_code(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' {
            let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
            let quote_len = if triple { 3 } else { 1 };
            i += quote_len;
            out.push_str("\"\"");
            while i < chars.len() {
                if chars[i] == '\\' {
                    if chars.get(i + 1) == Some(&'\n') {
                        out.push('\n');
                    }
                    i += 2;
                    continue;
                }
                if chars[i] == '\n' {
                    out.push('\n');
                    if !triple {
                        i += 1;
                        break;
                    }
                }
                if chars[i] == c
                    && (!triple || (chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c)))
                {
                    i += quote_len;
                    break;
                }
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The import statements of a module: (line, module named relative or absolute, names).
fn python_imports(source: &str) -> Vec<(usize, String, Vec<String>)> {
    let code = python_code(source);
    // Logical lines: brackets and backslashes continue a statement.
    let mut statements: Vec<(usize, String)> = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    let mut depth = 0i32;
    for (index, row) in code.lines().enumerate() {
        if current.is_empty() {
            start = index + 1;
        }
        let continued = row.trim_end().ends_with('\\');
        for c in row.chars() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
        }
        current.push_str(row.trim_end().trim_end_matches('\\'));
        current.push(' ');
        if depth <= 0 && !continued {
            for part in current.split(';') {
                statements.push((start, part.trim().to_owned()));
            }
            current.clear();
            depth = 0;
        }
    }
    let mut out = Vec::new();
    for (line, statement) in statements {
        let words = |s: &str| -> Vec<String> {
            s.replace(['(', ')'], " ")
                .split(',')
                .filter_map(|w| w.split_whitespace().next().map(str::to_owned))
                .collect()
        };
        if let Some(rest) = statement.strip_prefix("from ") {
            if let Some((module, names)) = rest.split_once(" import ") {
                out.push((line, module.trim().to_owned(), words(names)));
            }
        } else if let Some(rest) = statement.strip_prefix("import ") {
            for module in words(rest) {
                out.push((line, module, Vec::new()));
            }
        }
    }
    out
}

/// The graph of the Python package in `package` (its directory; the package's name is the
/// directory's).
fn python_graph(base: &Path, package: &Path) -> Graph {
    let mut graph = Graph::default();
    add_python_package(&mut graph, base, package, None);
    graph
}

/// Adds the Python package in `package` to `graph`, with `extension` (its name in the
/// package and the node of the Rust crate root that builds it) as one of its modules, and
/// the edges of the Rust modules in `graph` that import the package's modules by name: a
/// ring through both languages is a circle too.
fn add_python_package(
    graph: &mut Graph,
    base: &Path,
    package: &Path,
    extension: Option<(&str, usize)>,
) {
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    // Modules by dotted name; a package is its __init__.py.
    fn walk(
        graph: &mut Graph,
        names: &mut BTreeMap<String, usize>,
        base: &Path,
        dir: &Path,
        dotted: &str,
        parent: Option<usize>,
    ) {
        let init = dir.join("__init__.py");
        let node = graph.add_node(relative(base, &init), parent);
        names.insert(dotted.to_owned(), node);
        if let Some(parent) = parent {
            let short = dotted.rsplit('.').next().unwrap().to_owned();
            graph.nodes[parent].children.insert(short, node);
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for path in entries {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() && path.join("__init__.py").exists() {
                walk(
                    graph,
                    names,
                    base,
                    &path,
                    &format!("{dotted}.{stem}"),
                    Some(node),
                );
            } else if path.extension().is_some_and(|e| e == "py") && stem != "__init__" {
                let child = graph.add_node(relative(base, &path), Some(node));
                graph.nodes[node].children.insert(stem.clone(), child);
                names.insert(format!("{dotted}.{stem}"), child);
            }
        }
    }
    let top = package.file_name().unwrap().to_string_lossy().into_owned();
    let first = graph.nodes.len();
    walk(graph, &mut names, base, package, &top, None);
    // The Python modules, before the extension joins the names.
    let modules: Vec<(String, usize)> = names
        .iter()
        .filter(|(_, i)| **i >= first)
        .map(|(n, i)| (n.clone(), *i))
        .collect();
    if let Some((name, node)) = extension {
        names.insert(format!("{top}.{name}"), node);
    }
    // The deepest module a dotted name reaches.
    let deepest = |names: &BTreeMap<String, usize>, name: &str| -> Option<usize> {
        let mut name = name.to_owned();
        loop {
            if let Some(found) = names.get(&name) {
                return Some(*found);
            }
            name = name.rsplit_once('.')?.0.to_owned();
        }
    };
    for (from, line, name) in std::mem::take(&mut graph.python_imports) {
        if (name == top || name.starts_with(&format!("{top}.")))
            && let Some(target) = deepest(&names, &name)
        {
            graph.add_edge(from, target, line, format!("import({name:?})"));
        }
    }
    for (dotted, node) in modules {
        let file = base.join(&graph.nodes[node].file);
        let source = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let is_package = file.file_name().is_some_and(|n| n == "__init__.py");
        // The package a relative import counts from.
        let own_package: Vec<&str> = {
            let mut parts: Vec<&str> = dotted.split('.').collect();
            if !is_package {
                parts.pop();
            }
            parts
        };
        for (line, module, imported) in python_imports(&source) {
            let dots = module.chars().take_while(|c| *c == '.').count();
            let absolute = if dots > 0 {
                if dots > own_package.len() {
                    continue;
                }
                let mut parts: Vec<&str> = own_package[..own_package.len() + 1 - dots].to_vec();
                let rest = &module[dots..];
                if !rest.is_empty() {
                    parts.extend(rest.split('.'));
                }
                parts.join(".")
            } else {
                module.clone()
            };
            if absolute != top && !absolute.starts_with(&format!("{top}.")) {
                continue;
            }
            let statement = if imported.is_empty() {
                format!("import {module}")
            } else {
                format!("from {module} import {}", imported.join(", "))
            };
            let mut targets = Vec::new();
            if imported.is_empty() {
                targets.extend(deepest(&names, &absolute));
            } else {
                for name in &imported {
                    targets.extend(deepest(&names, &format!("{absolute}.{name}")));
                }
            }
            for target in targets {
                graph.add_edge(node, target, line, statement.clone());
            }
        }
    }
}

fn relative(base: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(base).unwrap_or(path).to_path_buf()
}

fn report(graph: &Graph) -> Vec<String> {
    graph
        .cycles()
        .iter()
        .map(|(ring, members)| graph.describe(ring, members))
        .collect()
}

#[test]
fn no_module_circles_in_the_rust_crates_or_the_python_package() {
    // No contract line: the house rule of docs/architecture.md ("Dependency rules").
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut packages = vec![repo.to_path_buf()];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo.join("crates"))
        .expect("crates/ is readable")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    crates.sort();
    for krate in crates {
        if krate.join("fuzz/Cargo.toml").exists() {
            packages.push(krate.join("fuzz"));
        }
        packages.push(krate);
    }
    // One graph: the Python package imports its extension (`_native`, the hermes-binding
    // crate), and a Rust module that imported the package back would close a ring.
    let mut graph = rust_graph(repo, &packages);
    let rust_nodes = graph.nodes.len();
    let native = graph
        .nodes
        .iter()
        .position(|n| n.file == Path::new("crates/hermes-binding/src/lib.rs"))
        .expect("the hermes-binding crate root is scanned");
    add_python_package(
        &mut graph,
        repo,
        &repo.join("crates/hermes-binding/python/hermes_e2b"),
        Some(("_native", native)),
    );
    // The scan must have found the trees, or an empty graph would pass.
    assert!(
        rust_nodes > 100,
        "only {rust_nodes} Rust file modules found"
    );
    assert!(
        graph.nodes.len() - rust_nodes >= 5,
        "only {} Python modules found",
        graph.nodes.len() - rust_nodes
    );
    let circles = report(&graph);
    assert!(
        circles.is_empty(),
        "{} module circle(s); break each by moving what the modules share into a module \
         below them:\n{}",
        circles.len(),
        circles.join("\n")
    );
}

/// A throwaway directory with the given files.
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn rust_circles(files: &[(&str, &str)]) -> Vec<String> {
    let dir = fixture(files);
    let graph = rust_graph(dir.path(), &[dir.path().to_path_buf()]);
    report(&graph)
}

#[test]
fn a_ring_of_sibling_modules_through_use_groups_and_code_paths_is_a_circle() {
    let circles = rust_circles(&[
        (
            "src/main.rs",
            "mod a;\nmod b;\nmod c;\nuse crate::a::A;\nstruct Error;\nfn main() {}\n",
        ),
        (
            "src/a.rs",
            "use crate::{Error, b::{self, B}};\npub struct A;\n",
        ),
        // A path in code, not in a `use`.
        (
            "src/b.rs",
            "pub struct B;\nfn f() { let _ = super::c::C::new(); }\n",
        ),
        // A `use` inside a function still counts.
        (
            "src/c.rs",
            "pub struct C;\nfn g() { use self::super::a as x; }\n",
        ),
    ]);
    assert_eq!(
        circles,
        [
            "src/a.rs -> src/b.rs -> src/c.rs -> src/a.rs\n    src/a.rs:1: use crate::b\n    \
          src/b.rs:2: super::c::C::new\n    src/c.rs:2: use self::super::a"
        ]
    );
}

#[test]
fn a_dag_with_parent_child_references_passes() {
    let circles = rust_circles(&[
        // The root uses its children, and they use its Error: the enclosing scope.
        (
            "src/lib.rs",
            "mod state;\nmod run;\npub use run::go;\npub struct Error;\n",
        ),
        ("src/state.rs", "use crate::Error;\npub struct State;\n"),
        (
            "src/run.rs",
            "mod step;\nuse crate::{Error, state::State};\npub fn go() { step::one(); }\n",
        ),
        // A grandchild using its parent and a cousin above: no circle.
        (
            "src/run/step.rs",
            "use super::go;\nuse crate::state::State;\npub fn one() {}\n\
          #[cfg(test)]\nmod tests { use super::*; use super::super::go; }\n",
        ),
        // Comments and strings name no module.
        (
            "tests/t.rs",
            "// crate::x::y\nconst S: &str = \"crate::y\";\nfn main() {}\n",
        ),
    ]);
    assert_eq!(circles, Vec::<String>::new());
}

#[test]
fn cousins_in_different_directories_and_path_modules_form_circles() {
    let circles = rust_circles(&[
        ("src/lib.rs", "mod x;\nmod y;\n"),
        ("src/x/mod.rs", "mod inner;\n"),
        (
            "src/x/inner.rs",
            "pub(crate) fn f() { crate::y::deep::g() }\n",
        ),
        (
            "src/y.rs",
            "#[path = \"y_deep.rs\"]\npub(crate) mod deep;\n",
        ),
        (
            "src/y_deep.rs",
            "pub(crate) fn g() { crate::x::inner::f() }\n",
        ),
    ]);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].starts_with("src/x/inner.rs -> src/y_deep.rs -> src/x/inner.rs"),
        "{circles:?}"
    );
}

fn python_circles(files: &[(&str, &str)]) -> Vec<String> {
    let dir = fixture(files);
    let graph = python_graph(dir.path(), &dir.path().join("pkg"));
    report(&graph)
}

#[test]
fn a_lazy_python_import_closing_a_ring_is_a_circle() {
    let circles = python_circles(&[
        ("pkg/__init__.py", "from .a import A\nfrom . import b\n"),
        (
            "pkg/a.py",
            "\"\"\"from . import c (a docstring, no import)\"\"\"\nfrom .b import (\n    B,\n)\n",
        ),
        (
            "pkg/b.py",
            "import os\ndef f():\n    import pkg.a as a  # lazy\n",
        ),
        ("pkg/c.py", "from pkg import a\n"),
    ]);
    assert_eq!(
        circles,
        [
            "pkg/a.py -> pkg/b.py -> pkg/a.py\n    pkg/a.py:2: from .b import B\n    \
          pkg/b.py:3: import pkg.a"
        ]
    );
}

#[test]
fn a_python_dag_with_package_level_imports_passes() {
    let circles = python_circles(&[
        ("pkg/__init__.py", "from . import a\nVERSION = 1\n"),
        ("pkg/a.py", "from . import VERSION, b\n"),
        (
            "pkg/b.py",
            "from . import VERSION\nfrom .sub.leaf import x\n",
        ),
        ("pkg/sub/__init__.py", ""),
        (
            "pkg/sub/leaf.py",
            "from .. import VERSION\nx = 'from ..a import nothing'\n",
        ),
    ]);
    assert_eq!(circles, Vec::<String>::new());
}

#[test]
fn a_ring_through_a_parents_use_of_its_child_is_a_circle() {
    // The parent is used from outside, and its child uses that user: the parent's re-export
    // or call of its child is what closes the ring.
    let circles = rust_circles(&[
        ("src/lib.rs", "mod inventory;\nmod native;\n"),
        ("src/inventory.rs", "use crate::native::Settings;\n"),
        (
            "src/native/mod.rs",
            "mod settings;\nmod subagents;\npub use settings::Settings;\npub use subagents::Child;\n",
        ),
        ("src/native/settings.rs", "pub struct Settings;\n"),
        (
            "src/native/subagents.rs",
            "pub struct Child;\nfn pull(_: &crate::inventory::Inventory) {}\n",
        ),
    ]);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].starts_with(
            "src/inventory.rs -> src/native/mod.rs -> src/native/subagents.rs -> src/inventory.rs\n"
        ),
        "{circles:?}"
    );
}

#[test]
fn a_ring_through_a_python_extension_and_back_is_a_circle() {
    let dir = fixture(&[
        (
            "src/lib.rs",
            "mod chats;\nfn module() { chats::register(); }\n",
        ),
        (
            "src/chats.rs",
            "pub fn register() { let _ = PyModule::import(py, \"pkg.gateway\"); }\n",
        ),
        ("pkg/__init__.py", ""),
        ("pkg/gateway.py", "def f():\n    from . import _native\n"),
        ("pkg/quiet.py", "from ._native import Backend\n"),
    ]);
    let mut graph = rust_graph(dir.path(), &[dir.path().to_path_buf()]);
    add_python_package(
        &mut graph,
        dir.path(),
        &dir.path().join("pkg"),
        Some(("_native", 0)),
    );
    assert_eq!(
        report(&graph),
        [
            "pkg/gateway.py -> src/lib.rs -> src/chats.rs -> pkg/gateway.py\n    \
          pkg/gateway.py:2: from . import _native\n    src/lib.rs:2: chats::register\n    \
          src/chats.rs:1: import(\"pkg.gateway\")"
        ]
    );
}

#[test]
fn a_knot_of_rings_is_one_circle_naming_all_its_modules() {
    let circles = rust_circles(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "use crate::b::B;\n"),
        ("src/b.rs", "use crate::{a::A, c::C};\n"),
        ("src/c.rs", "use crate::a::A;\n"),
    ]);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].starts_with("src/a.rs -> src/b.rs -> src/a.rs\n")
            && circles[0].ends_with("all 3 modules of this circle: src/a.rs, src/b.rs, src/c.rs"),
        "{circles:?}"
    );
}
