//! The core crate's shape, as a contract: no circle among its modules and no file over 600
//! lines (a file's `#[cfg(test)]` module aside). import-linter keeps the Python layers
//! acyclic; this is the same check for rust/src, so a new circle fails `cargo test`.
//!
//! A dependency is any path the code names: a `use` tree (`use crate::a::{b, c::D}`, `use
//! super::X`, `pub use child::Y`) or an inline path (`crate::a::f()`, `super::X`). It points at
//! the deepest module of the path that is a file of rust/src. Comments, string literals and
//! `#[cfg(test)]` modules are not code the crate depends on, so they are skipped. Circles are
//! looked for twice: among files (`reader::values` is its own node) and among the crate's
//! top-level modules (everything under `store/` is `store`), the layers a reader sees first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lines a file may have before its `#[cfg(test)]` module.
const MAX_LINES: usize = 600;

/// A module path (`["store", "remote_reader"]`); the crate root is empty.
type Module = Vec<String>;
type Graph = BTreeMap<Module, BTreeSet<Module>>;

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file defines: `reader/mod.rs` is `reader`, `index/view.rs` is `index::view`,
/// `lib.rs` the root.
fn module_of(rel: &Path) -> Module {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text before the first column-0 `#[cfg(test)]` (the file's test module).
fn non_test_part(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with("#[cfg(test)]") {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// `code` with comments removed and string and char literals emptied, so that neither a doc
/// link (`[crate::x]`) nor a URL in a message (`"s3://..."`) reads as a path.
fn strip_comments_and_literals(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && (i == 0
                || !is_ident(c[i - 1])
                || (c[i - 1] == 'b' && (i < 2 || !is_ident(c[i - 2]))))
        {
            // Raw string r"..." or r#"..."# (or br"..."): ends at a quote followed by as many #.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the former is skipped.
            if next == Some('\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// Split `s` at its top-level commas (not inside braces).
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut parts) = (0i32, 0, Vec::new());
    for (i, ch) in s.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Every path of a use tree: `a::{b, c::{d, e as f}}` gives `a::b`, `a::c::d`, `a::c::e`.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for item in split_top(tree) {
        let item: String = item.split_whitespace().collect::<Vec<_>>().join(" ");
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        if let (Some(open), true) = (item.find('{'), item.ends_with('}')) {
            let prefix: Vec<String> = item[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            for sub in expand_use_tree(&item[open + 1..item.len() - 1]) {
                out.push(prefix.iter().cloned().chain(sub).collect());
            }
        } else {
            let path = item.split(" as ").next().unwrap_or(item);
            out.push(
                path.split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

/// Starts of the word `word` in `code` (not part of a longer identifier).
fn word_starts(code: &str, word: &str) -> Vec<usize> {
    code.match_indices(word)
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = code[..i].chars().next_back();
            let after = code[i + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .collect()
}

/// The `use` declarations of `code` as paths, and the code with them removed.
fn use_paths(code: &str) -> (Vec<Vec<String>>, String) {
    let mut paths = Vec::new();
    let mut rest = String::with_capacity(code.len());
    let mut last = 0;
    for at in word_starts(code, "use") {
        if at < last {
            continue;
        }
        let Some(end) = code[at..].find(';').map(|e| at + e) else {
            continue;
        };
        paths.extend(expand_use_tree(&code[at + 3..end]));
        rest.push_str(&code[last..at]);
        last = end + 1;
    }
    rest.push_str(&code[last..]);
    (paths, rest)
}

/// Inline paths starting with `crate::`, `super::` or `self::`.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for head in ["crate", "super", "self"] {
        for at in word_starts(code, head) {
            let tail = &code[at..];
            let len = tail
                .char_indices()
                .find(|&(_, ch)| !(is_ident(ch) || ch == ':'))
                .map_or(tail.len(), |(i, _)| i);
            let path: Vec<String> = tail[..len]
                .trim_end_matches(':')
                .split("::")
                .map(String::from)
                .collect();
            if path.len() > 1 {
                out.push(path);
            }
        }
    }
    out
}

/// The module of `modules` that `path`, named in module `cur`, points at; `None` for a path
/// outside the crate (std, dependencies) or one of `cur`'s own items.
fn resolve(cur: &Module, path: &[String], modules: &BTreeSet<Module>) -> Option<Module> {
    let first = path.first()?;
    let (mut base, rest): (Module, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "super" | "self" => {
            let mut base = cur.clone();
            let mut k = 0;
            while let Some(seg) = path.get(k) {
                match seg.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                k += 1;
            }
            (base, &path[k..])
        }
        child => {
            let mut m = cur.clone();
            m.push(child.to_string());
            if !modules.contains(&m) {
                return None;
            }
            (cur.clone(), path)
        }
    };
    let mut best = base.clone();
    for seg in rest {
        base.push(seg.clone());
        if modules.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    (best != *cur && !best.is_empty()).then_some(best)
}

/// Module-level dependency graph of `files` (module, source text).
fn graph(files: &[(Module, String)]) -> Graph {
    let modules: BTreeSet<Module> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g = Graph::new();
    for (m, text) in files {
        let code = strip_comments_and_literals(non_test_part(text));
        let (mut paths, rest) = use_paths(&code);
        paths.extend(inline_paths(&rest));
        let deps = g.entry(m.clone()).or_default();
        for p in paths {
            if let Some(d) = resolve(m, &p, &modules) {
                deps.insert(d);
            }
        }
    }
    g
}

/// The same graph with every module replaced by its top-level module.
fn top_level(g: &Graph) -> Graph {
    let mut t = Graph::new();
    for (m, deps) in g {
        let Some(top) = m.first() else { continue };
        let entry = t.entry(vec![top.clone()]).or_default();
        for d in deps {
            if d[0] != *top {
                entry.insert(vec![d[0].clone()]);
            }
        }
    }
    t
}

/// The strongly connected groups of more than one module (Tarjan), each sorted.
fn circles(g: &Graph) -> Vec<Vec<Module>> {
    struct State<'a> {
        g: &'a Graph,
        next: usize,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Module) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut group = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on_stack.remove(w);
                group.push(w.clone());
                if w == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                s.found.push(group);
            }
        }
    }
    let mut s = State {
        g,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Each circle with the edges that close it, for the failure message.
fn describe(g: &Graph, found: &[Vec<Module>]) -> String {
    let mut msg = String::new();
    for group in found {
        let names: Vec<String> = group.iter().map(name).collect();
        msg.push_str(&format!("circle: {}\n", names.join(", ")));
        for a in group {
            for b in g[a].iter().filter(|b| group.contains(b)) {
                msg.push_str(&format!("    {} -> {}\n", name(a), name(b)));
            }
        }
    }
    msg
}

fn src_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn crate_files() -> Vec<(Module, String)> {
    let src = src_dir("rust/src");
    let mut paths = Vec::new();
    rs_files(&src, &mut paths);
    paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).expect("under rust/src");
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{rel:?}: {e}"));
            (module_of(rel), text)
        })
        .collect()
}

#[test]
fn no_circle_among_the_core_modules() {
    let files = crate_files();
    assert!(files.len() > 20, "rust/src not found or nearly empty");
    let g = graph(&files);
    // The walk must see the crate's real edges, or an empty graph would pass.
    let edges: usize = g.values().map(BTreeSet::len).sum();
    assert!(
        edges > 50,
        "only {edges} dependency edges found: the parser is broken"
    );
    assert!(g[&vec!["writer".to_string()]].contains(&vec!["shard".to_string()]));
    let found = circles(&g);
    assert!(
        found.is_empty(),
        "module circles in rust/src:\n{}",
        describe(&g, &found)
    );
    let t = top_level(&g);
    let found = circles(&t);
    assert!(
        found.is_empty(),
        "circles among the top-level modules of rust/src:\n{}",
        describe(&t, &found)
    );
}

#[test]
fn the_check_finds_circles_through_use_trees_inline_paths_and_parents() {
    let m = |s: &str| s.split("::").map(String::from).collect::<Module>();
    let files =
        vec![
        (m("a"), "use crate::{b::{self, X}, format::*};\n".to_string()),
        (m("b"), "fn f() { crate::c::g(\"crate::a::not_code\"); }\n".to_string()),
        // Only a comment and a test module name `a`: neither is a dependency.
        (
            m("c"),
            "// crate::a\n/// [`crate::a`]\nfn g() {}\n#[cfg(test)]\nmod tests { use crate::a; }\n"
                .to_string(),
        ),
        (m("format"), String::new()),
        (m("p"), "pub use child::Y;\n".to_string()),
        (m("p::child"), "use super::Z;\npub struct Y;\n".to_string()),
    ];
    let g = graph(&files);
    assert_eq!(g[&m("a")], BTreeSet::from([m("b"), m("format")]));
    assert_eq!(g[&m("b")], BTreeSet::from([m("c")]));
    assert!(
        g[&m("c")].is_empty(),
        "comments and tests are not dependencies"
    );
    assert_eq!(circles(&g), vec![vec![m("p"), m("p::child")]]);

    // Closing a → b → c → a makes the three one circle, found at both levels.
    let mut files = files;
    files[2].1 = "fn g() { crate::a::h(); }\n".to_string();
    let g = graph(&files);
    let found = circles(&g);
    assert!(found.contains(&vec![m("a"), m("b"), m("c")]), "{found:?}");
    let t = top_level(&graph(&[
        (m("x::one"), "use crate::y::two;\n".to_string()),
        (m("y::two"), "use crate::x::three;\n".to_string()),
        (m("x::three"), String::new()),
        (m("x"), String::new()),
        (m("y"), String::new()),
    ]));
    assert_eq!(circles(&t), vec![vec![m("x"), m("y")]]);
}

#[test]
fn no_core_or_binding_file_over_600_lines() {
    let mut too_long = Vec::new();
    for dir in ["rust/src", "rust/py/src"] {
        let mut paths = Vec::new();
        rs_files(&src_dir(dir), &mut paths);
        for p in paths {
            let text = std::fs::read_to_string(&p).expect("readable");
            let n = non_test_part(&text).lines().count();
            if n > MAX_LINES {
                too_long.push(format!("{} ({n} lines)", p.display()));
            }
        }
    }
    assert!(
        too_long.is_empty(),
        "files over {MAX_LINES} lines before their #[cfg(test)] module (split them by what a reader looks for):\n{}",
        too_long.join("\n")
    );
}
