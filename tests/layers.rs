//! The layer check: every module of `src/` imports only modules of its own layer or
//! below (docs/design.md, "Layers").
//!
//! Each top-level module is mapped to a layer ([`LAYERS`]); `crate::…` paths in code
//! (not in comments or doc links, not in string literals) are resolved to the top-level
//! module they name, through `lib.rs`'s re-exports for names used from the crate root
//! (`crate::Error`, `crate::DeviceSlice`). A path into a higher layer is a violation,
//! named with the file, line, path and both layers.
//!
//! Modules listed in `tests/layers_not_enforced.txt` have their violations printed but
//! do not fail the check: the switch that enforces the layers crate-wide is emptying
//! that file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, low to high, and the top-level modules in each.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "utilities",
        &[
            "error",
            "sync",
            "fnv",
            "config",
            "uuid",
            "loader",
            "cuda_version",
        ],
    ),
    ("driver", &["driver"]),
    ("device", &["device"]),
    ("binding", &["context"]),
    ("tracking/teardown", &["access", "teardown"]),
    (
        "resources",
        &["memory", "stream", "module", "launch", "copy", "graph"],
    ),
    (
        "integrations",
        &["interop", "dlpack", "ipc", "blas", "collective"],
    ),
];

/// The layer of a top-level module: its index in [`LAYERS`] and its name.
fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, mods))| mods.contains(&module))
        .map(|(i, (name, _))| (i, *name))
}

/// One import of a higher layer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    path: String,
    from: &'static str,
    to: &'static str,
    module: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {} imports a higher layer ({} -> {})",
            self.file, self.line, self.path, self.module, self.from, self.to
        )
    }
}

/// `src` with comments replaced by spaces and string and char literals emptied, line
/// breaks kept (so byte offsets still give line numbers).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |s: &str, out: &mut String| {
        for c in s.chars() {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(src.len(), |e| i + e);
            blank(&src[i..end], &mut out);
            i = end;
        } else if rest.starts_with("/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if src[j..].starts_with("/*") {
                    depth += 1;
                    j += 2;
                } else if src[j..].starts_with("*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += src[j..].chars().next().map_or(1, char::len_utf8);
                }
            }
            blank(&src[i..j], &mut out);
            i = j;
        } else if let Some(hashes) = raw_string_start(src, i) {
            let open = 2 + hashes; // (b)r, #..., "
            let close = format!("\"{}", "#".repeat(hashes));
            let end = src[i + open..]
                .find(&close)
                .map_or(src.len(), |e| i + open + e + close.len());
            blank(&src[i..end], &mut out);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(src.len());
            blank(&src[i..end], &mut out);
            i = end;
        } else if b[i] == b'\'' && char_literal_len(&src[i..]).is_some() {
            let n = char_literal_len(&src[i..]).unwrap_or(1);
            blank(&src[i..i + n], &mut out);
            i += n;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The number of `#` of a raw string literal starting at `i` (`r"`, `r#"`, `br"`).
fn raw_string_start(src: &str, i: usize) -> Option<usize> {
    let b = src.as_bytes();
    if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
        return None; // inside an identifier
    }
    let r = if b[i] == b'b' { i + 1 } else { i };
    if b.get(r) != Some(&b'r') {
        return None;
    }
    let hashes = src[r + 1..].bytes().take_while(|&c| c == b'#').count();
    (b.get(r + 1 + hashes) == Some(&b'"')).then_some(hashes + (r - i))
}

/// The length of a char literal at the start of `s` (`'a'`, `'\n'`, `'\u{1F600}'`), or
/// `None` for a lifetime.
fn char_literal_len(s: &str) -> Option<usize> {
    let mut chars = s.char_indices().skip(1);
    let (_, c) = chars.next()?;
    if c == '\\' {
        let close = s[2..].find('\'')?;
        return Some(2 + close + 1);
    }
    let (j, next) = chars.next()?;
    (next == '\'').then_some(j + 1)
}

/// The `crate::…` paths in `code` with their byte offsets; a group
/// (`crate::{a::B, c}`) gives one path per member.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("crate::") {
        let at = from + k;
        from = at + 7;
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `mycrate::`
        }
        let rest = &code[at + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut member = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    let m = member.trim().to_owned();
                    if !m.is_empty() {
                        found.push((m, at));
                    }
                    member.clear();
                    if depth == 0 {
                        break;
                    }
                } else {
                    member.push(c);
                }
            }
        } else {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            found.push((path, at));
        }
    }
    found
}

/// The names `lib.rs` re-exports at the crate root, each with the top-level module it
/// comes from (`Error` -> `error`, `libs` -> `driver`).
fn root_names(lib_rs: &str) -> BTreeMap<String, String> {
    let code = code_only(lib_rs);
    let mut names = BTreeMap::new();
    for stmt in code.split(';') {
        let stmt = stmt.trim();
        let Some(at) = stmt.find("pub use ") else {
            if let Some(at) = stmt.find("mod ") {
                let name: String = stmt[at + 4..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name.clone(), name);
            }
            continue;
        };
        let path = stmt[at + 8..].trim();
        let module: String = path
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if let Some(open) = path.find('{') {
            for member in path[open + 1..].trim_end_matches('}').split(',') {
                let member = member.trim();
                let name = member.rsplit(" as ").next().unwrap_or(member);
                let name = name.rsplit("::").next().unwrap_or(name).trim();
                if !name.is_empty() {
                    names.insert(name.to_owned(), module.clone());
                }
            }
        } else {
            let name = path.rsplit(" as ").next().unwrap_or(path);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            names.insert(name.to_owned(), module.clone());
        }
    }
    names
}

/// The top-level module a `src/` file belongs to (`src/memory/host.rs` -> `memory`);
/// `None` for the crate root.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_owned())
}

/// The violations in one file, `rel` its path under `src/`.
fn check_file(rel: &Path, text: &str, roots: &BTreeMap<String, String>) -> Vec<Violation> {
    let Some(module) = module_of(rel) else {
        return Vec::new();
    };
    let Some((from, from_name)) = layer_of(&module) else {
        return Vec::new();
    };
    let code = code_only(text);
    let mut out = Vec::new();
    for (path, at) in crate_paths(&code) {
        let first: String = path
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let target = roots.get(&first).cloned().unwrap_or(first);
        let Some((to, to_name)) = layer_of(&target) else {
            continue;
        };
        if to > from {
            out.push(Violation {
                file: format!("src/{}", rel.display()),
                line: code[..at].matches('\n').count() + 1,
                path: format!("crate::{path}"),
                from: from_name,
                to: to_name,
                module: format!("{module} -> {target}"),
            });
        }
    }
    out
}

/// Every `.rs` file under `dir`, relative to it.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read src/") {
            let path = entry.expect("read src/").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(dir).expect("under src/").to_path_buf());
            }
        }
    }
    files.sort();
    files
}

/// The modules whose violations are printed but not fatal.
fn not_enforced(root: &Path) -> Vec<String> {
    let list =
        std::fs::read_to_string(root.join("tests/layers_not_enforced.txt")).unwrap_or_default();
    list.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn modules_import_only_their_layer_or_below() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let roots = root_names(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let lenient = not_enforced(root);
    let (mut fatal, mut listed) = (Vec::new(), Vec::new());
    for rel in rust_files(&src) {
        let text = std::fs::read_to_string(src.join(&rel)).expect("read a source file");
        for v in check_file(&rel, &text, &roots) {
            let module = module_of(&rel).unwrap_or_default();
            if lenient.contains(&module) {
                listed.push(v);
            } else {
                fatal.push(v);
            }
        }
    }
    for v in &listed {
        println!("not enforced yet: {v}");
    }
    let fatal: Vec<String> = fatal.iter().map(ToString::to_string).collect();
    assert!(
        fatal.is_empty(),
        "layer violations (docs/design.md, \"Layers\"):\n{}",
        fatal.join("\n")
    );
}

#[test]
fn a_fake_violation_is_caught_and_comments_are_not() {
    let roots = root_names("pub mod device;\npub use memory::{DeviceSlice, host};\n");
    let fake = "\
//! Docs may link [`Device`](crate::device::Device) freely.
use crate::error::Result;
/* crate::memory::DeviceSlice in a block comment */
const S: &str = \"crate::memory\";
fn f() -> crate::DeviceSlice<u8> { todo!() }
use crate::{error::Error, device::Device};
";
    let v = check_file(Path::new("driver/fake.rs"), fake, &roots);
    let got: Vec<(usize, &str, &str, &str)> = v
        .iter()
        .map(|v| (v.line, v.path.as_str(), v.from, v.to))
        .collect();
    assert_eq!(
        got,
        [
            (5, "crate::DeviceSlice", "driver", "resources"),
            (6, "crate::device::Device", "driver", "device"),
        ],
        "{v:#?}"
    );
    let text = v[1].to_string();
    assert!(
        text.contains("src/driver/fake.rs:6") && text.contains("driver -> device"),
        "{text}"
    );
    // The same imports from a higher layer are fine.
    assert!(check_file(Path::new("ipc/fake.rs"), fake, &roots).is_empty());
}
