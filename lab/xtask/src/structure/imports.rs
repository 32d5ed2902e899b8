//! The import graph between the file modules of one crate root: an edge `a -> b` when
//! non-test code in `a` names something that `b` defines, through `use` trees and paths
//! (`crate::`, `super::`, `self::`, child modules), with names resolved through
//! re-exports (`pub use error::Error` in `lib.rs` makes `crate::Error` point to `error`).
//! A `mod x;` declaration alone is no edge, and neither is a parent's re-export of a
//! descendant's item that the parent's own code does not use.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};
use syn::{ImplItem, Item, TraitItem, UseTree};

use super::modules::{Tree, is_reexport, is_test_only, item_attrs};

/// How deep re-export chains are followed before giving up (guards against loops).
const MAX_DEPTH: usize = 16;

/// Edges between modules (indexes into [`Tree::modules`]), each with one path that
/// makes it, as written in the source.
pub(crate) type Edges = BTreeMap<(usize, usize), String>;

/// One path named in a module's non-test code.
#[derive(Debug)]
struct Ref {
    /// The segments as written.
    segs: Vec<String>,
    /// The inline modules (`mod x { ... }`) the path sits in, inside the file.
    inline: Vec<String>,
    /// For a re-export (`pub use`), the name it exports (`*` for a glob).
    reexport: Option<String>,
}

/// The import graph of `tree`.
pub(crate) fn edges(tree: &Tree) -> Edges {
    let mut edges = Edges::new();
    for (from, module) in tree.modules.iter().enumerate() {
        let mut collector = Collector::default();
        collector.visit_file(&module.ast);
        for r in &collector.refs {
            let Some(abs) = normalize(tree, from, &r.inline, &r.segs, 0) else {
                continue;
            };
            let Some(to) = resolve(tree, &abs, 0) else {
                continue;
            };
            if to == from {
                continue;
            }
            let target = &tree.modules[to].path;
            let descendant = target.starts_with(&module.path);
            if let Some(name) = &r.reexport
                && descendant
                && !collector.code_names.contains(name)
            {
                continue;
            }
            edges.entry((from, to)).or_insert_with(|| r.segs.join("::"));
        }
    }
    edges
}

/// Makes `segs`, written in module `at` (inside inline modules `inline`), absolute
/// (segments after `crate::`); `None` for paths into other crates or locals.
fn normalize(
    tree: &Tree,
    at: usize,
    inline: &[String],
    segs: &[String],
    depth: usize,
) -> Option<Vec<String>> {
    let module = &tree.modules[at];
    let mut base: Vec<String> = module.path.iter().chain(inline).cloned().collect();
    let first = segs.first()?;
    let rest = match first.as_str() {
        "crate" => {
            base.clear();
            &segs[1..]
        }
        "self" => &segs[1..],
        "super" => {
            let supers = segs.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            &segs[supers..]
        }
        name if inline.is_empty()
            && depth < MAX_DEPTH
            && (module.children.contains_key(name)
                || module.items.contains(name)
                || module.imports.contains_key(name)) =>
        {
            segs
        }
        _ => return None,
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The module that defines the item at absolute path `segs` (or the module it names).
/// A name that is neither a child module, an item nor an import of the module it is
/// looked up in is taken to be defined there (enum variants, macro-made items).
fn resolve(tree: &Tree, segs: &[String], depth: usize) -> Option<usize> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut cur = 0;
    for (i, name) in segs.iter().enumerate() {
        let module = &tree.modules[cur];
        if let Some(&child) = module.children.get(name) {
            cur = child;
            continue;
        }
        if module.items.contains(name) {
            return Some(cur);
        }
        if let Some(target) = module.imports.get(name) {
            let mut next = normalize(tree, cur, &[], target, depth + 1)?;
            next.extend(segs[i + 1..].iter().cloned());
            return resolve(tree, &next, depth + 1);
        }
        for glob in &module.globs {
            let Some(glob) = normalize(tree, cur, &[], glob, depth + 1) else {
                continue;
            };
            let Some(source) = resolve(tree, &glob, depth + 1) else {
                continue;
            };
            let m = &tree.modules[source];
            if m.path == glob
                && (m.children.contains_key(name)
                    || m.items.contains(name)
                    || m.imports.contains_key(name))
            {
                let mut next = glob;
                next.extend(segs[i..].iter().cloned());
                return resolve(tree, &next, depth + 1);
            }
        }
        return Some(cur);
    }
    Some(cur)
}

/// Walks one file's non-test code and collects the paths it names.
#[derive(Debug, Default)]
struct Collector {
    refs: Vec<Ref>,
    /// The inline modules around the current position.
    inline: Vec<String>,
    /// Every first segment of a path in code (not in `use`), for the re-export rule.
    code_names: BTreeSet<String>,
}

impl Collector {
    fn push(&mut self, segs: Vec<String>, reexport: Option<String>) {
        self.refs.push(Ref {
            segs,
            inline: self.inline.clone(),
            reexport,
        });
    }

    /// Records every path of a `use` tree.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>, reexport: bool) {
        let export = |name: &str| reexport.then(|| name.to_owned());
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix, reexport);
                prefix.pop();
            }
            UseTree::Name(n) => {
                let mut segs = prefix.clone();
                let name = if n.ident == "self" {
                    prefix.last().cloned().unwrap_or_default()
                } else {
                    segs.push(n.ident.to_string());
                    n.ident.to_string()
                };
                self.push(segs, export(&name));
            }
            UseTree::Rename(r) => {
                let mut segs = prefix.clone();
                if r.ident != "self" {
                    segs.push(r.ident.to_string());
                }
                self.push(segs, export(&r.rename.to_string()));
            }
            UseTree::Glob(_) => self.push(prefix.clone(), export("*")),
            UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix, reexport);
                }
            }
        }
    }

    /// Records the paths in a macro's tokens: `a::b` sequences and lone idents.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(ident) => {
                    let mut segs = vec![ident.to_string()];
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (trees.get(i + 1), trees.get(i + 2))
                        && a.as_char() == ':'
                        && a.spacing() == Spacing::Joint
                        && b.as_char() == ':'
                        && let Some(TokenTree::Ident(next)) = trees.get(i + 3)
                    {
                        segs.push(next.to_string());
                        i += 3;
                    }
                    self.code_names.insert(segs[0].clone());
                    if segs.len() > 1 {
                        self.push(segs, None);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast Item) {
        if item_attrs(item).is_some_and(|attrs| is_test_only(attrs)) {
            return;
        }
        match item {
            Item::Use(u) => {
                let reexport = is_reexport(&u.vis) && self.inline.is_empty();
                self.use_tree(&u.tree, &mut Vec::new(), reexport);
            }
            Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    self.inline.push(m.ident.to_string());
                    items.iter().for_each(|item| self.visit_item(item));
                    self.inline.pop();
                }
            }
            _ => visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attrs = match item {
            ImplItem::Const(i) => &i.attrs,
            ImplItem::Fn(i) => &i.attrs,
            ImplItem::Type(i) => &i.attrs,
            ImplItem::Macro(i) => &i.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        let attrs = match item {
            TraitItem::Const(i) => &i.attrs,
            TraitItem::Fn(i) => &i.attrs,
            TraitItem::Type(i) => &i.attrs,
            TraitItem::Macro(i) => &i.attrs,
            _ => return visit::visit_trait_item(self, item),
        };
        if !is_test_only(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            if let Some(first) = segs.first() {
                self.code_names.insert(first.clone());
                let keyword = matches!(first.as_str(), "crate" | "self" | "super");
                if segs.len() > 1 || keyword {
                    self.push(segs, None);
                }
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
    }

    /// `pub(in crate::a)` names a module for privacy, not a dependency.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    /// Attributes (`derive`, `cfg`, docs) are not dependencies.
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}
