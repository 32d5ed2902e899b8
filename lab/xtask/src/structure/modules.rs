//! The file modules of one crate root: which `.rs` files the compiler reads (outside
//! `#[cfg(test)]`), their module paths, and the names each one defines or imports.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use syn::{Attribute, Item, UseTree, Visibility};

/// One `.rs` file of a crate root's module tree.
pub(crate) struct Module {
    /// Module path from the crate root (`[]` for the root itself).
    pub(crate) path: Vec<String>,
    /// The file, relative to `src/`.
    pub(crate) file: PathBuf,
    /// The parsed file.
    pub(crate) ast: syn::File,
    /// Child file modules (`mod x;`), by name, as indexes into [`Tree::modules`].
    pub(crate) children: BTreeMap<String, usize>,
    /// Names defined at the top level of the file (functions, types, inline modules...).
    pub(crate) items: BTreeSet<String>,
    /// Names brought in by top-level `use` items: name -> the path as written.
    pub(crate) imports: BTreeMap<String, Vec<String>>,
    /// Modules glob-imported at the top level (`use a::*`), as written.
    pub(crate) globs: Vec<Vec<String>>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("path", &self.path)
            .field("file", &self.file)
            .field("children", &self.children)
            .finish_non_exhaustive()
    }
}

/// The module tree of one crate root (`lib.rs`, `main.rs` or a `bin/` file).
#[derive(Debug)]
pub(crate) struct Tree {
    /// Index 0 is the root.
    pub(crate) modules: Vec<Module>,
}

impl Tree {
    /// A display name for module `index`: its path, or `crate` for the root.
    pub(crate) fn name(&self, index: usize) -> String {
        let path = &self.modules[index].path;
        if path.is_empty() {
            "crate".to_owned()
        } else {
            path.join("::")
        }
    }
}

/// The crate roots among `files` (paths relative to `src/`).
pub(crate) fn roots(files: &BTreeMap<PathBuf, String>) -> Vec<PathBuf> {
    files
        .keys()
        .filter(|path| {
            let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
            matches!(
                parts.as_slice(),
                ["lib.rs"] | ["main.rs"] | ["bin", _] | ["bin", _, "main.rs"]
            )
        })
        .cloned()
        .collect()
}

/// Reads the module tree under `root`, following `mod x;` declarations that are not
/// `#[cfg(test)]`. Files that do not parse are returned as errors and left out.
pub(crate) fn tree(files: &BTreeMap<PathBuf, String>, root: &Path) -> (Tree, Vec<String>) {
    let mut tree = Tree {
        modules: Vec::new(),
    };
    let mut errors = Vec::new();
    let mut queue = VecDeque::from([(Vec::new(), root.to_path_buf(), None)]);
    while let Some((path, file, parent)) = queue.pop_front() {
        let Some(text) = files.get(&file) else {
            continue;
        };
        let ast = match syn::parse_file(text) {
            Ok(ast) => ast,
            Err(err) => {
                errors.push(format!("{}: {err}", file.display()));
                continue;
            }
        };
        let index = tree.modules.len();
        if let Some((parent, name)) = parent {
            let parent: &mut Module = &mut tree.modules[parent];
            parent.children.insert(name, index);
        }
        let dir = child_dir(&file, index == 0);
        for (name, child) in declared_files(&ast, files, &dir) {
            let mut child_path = path.clone();
            child_path.push(name.clone());
            queue.push_back((child_path, child, Some((index, name))));
        }
        tree.modules.push(module(path, file, ast));
    }
    (tree, errors)
}

/// The directory where `mod x;` in `file` looks for `x.rs` and `x/mod.rs`.
fn child_dir(file: &Path, is_root: bool) -> PathBuf {
    let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
    if is_root || file.file_name().is_some_and(|n| n == "mod.rs") {
        dir
    } else {
        dir.join(file.file_stem().unwrap_or_default())
    }
}

/// The `mod x;` declarations of `ast` outside `#[cfg(test)]`, with the file each names.
fn declared_files(
    ast: &syn::File,
    files: &BTreeMap<PathBuf, String>,
    dir: &Path,
) -> Vec<(String, PathBuf)> {
    ast.items
        .iter()
        .filter_map(|item| match item {
            Item::Mod(m) if m.content.is_none() && !is_test_only(&m.attrs) => {
                let name = m.ident.to_string();
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(&name).join("mod.rs");
                let file = if files.contains_key(&flat) {
                    flat
                } else {
                    nested
                };
                Some((name, file))
            }
            _ => None,
        })
        .collect()
}

/// Indexes the names `ast` defines and imports at its top level.
fn module(path: Vec<String>, file: PathBuf, ast: syn::File) -> Module {
    let mut module = Module {
        path,
        file,
        ast: syn::File {
            shebang: None,
            attrs: Vec::new(),
            items: Vec::new(),
        },
        children: BTreeMap::new(),
        items: BTreeSet::new(),
        imports: BTreeMap::new(),
        globs: Vec::new(),
    };
    for item in &ast.items {
        if item_attrs(item).is_some_and(|attrs| is_test_only(attrs)) {
            continue;
        }
        if let Item::Use(u) = item {
            imports(&u.tree, &mut Vec::new(), &mut module);
        } else if let Some(name) = item_name(item) {
            module.items.insert(name);
        }
    }
    module.ast = ast;
    module
}

/// Records the names a `use` tree imports, with their paths as written.
fn imports(tree: &UseTree, prefix: &mut Vec<String>, module: &mut Module) {
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            imports(&p.tree, prefix, module);
            prefix.pop();
        }
        UseTree::Name(n) if n.ident == "self" => {
            if let Some(last) = prefix.last() {
                module.imports.insert(last.clone(), prefix.clone());
            }
        }
        UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            module.imports.insert(n.ident.to_string(), path);
        }
        UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            module.imports.insert(r.rename.to_string(), path);
        }
        UseTree::Glob(_) => module.globs.push(prefix.clone()),
        UseTree::Group(g) => g.items.iter().for_each(|t| imports(t, prefix, module)),
    }
}

/// The name an item defines in its module's namespace, if any.
fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Mod(i) => &i.ident,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The attributes of an item, for the kinds that can carry `#[cfg(test)]`.
pub(crate) fn item_attrs(item: &Item) -> Option<&Vec<Attribute>> {
    Some(match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => return None,
    })
}

/// Whether an item with these attributes exists only in test builds: `#[test]`,
/// `#[cfg(test)]` or `#[cfg(all(test, ...))]` (but not `#[cfg(any(test, ...))]`).
pub(crate) fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if attr.path().is_ident("test") {
            return true;
        }
        if !attr.path().is_ident("cfg") {
            return false;
        }
        attr.parse_args::<syn::Meta>()
            .is_ok_and(|meta| cfg_is_test(&meta))
    })
}

/// Whether a `cfg` predicate can only hold in test builds.
fn cfg_is_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|args| args.iter().any(cfg_is_test)),
        _ => false,
    }
}

/// Whether `vis` makes a `use` a re-export (anything but private).
pub(crate) fn is_reexport(vis: &Visibility) -> bool {
    !matches!(vis, Visibility::Inherited)
}
