//! Strongly connected components and a shortest cycle through one, for small graphs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A directed graph on nodes `0..n`, as sorted successor sets.
pub(crate) type Graph = Vec<BTreeSet<usize>>;

/// Builds a graph on `n` nodes from edges.
pub(crate) fn graph(n: usize, edges: impl IntoIterator<Item = (usize, usize)>) -> Graph {
    let mut graph = vec![BTreeSet::new(); n];
    for (from, to) in edges {
        graph[from].insert(to);
    }
    graph
}

/// The strongly connected components with more than one node, each sorted, in the
/// order of their smallest node.
pub(crate) fn components(graph: &Graph) -> Vec<Vec<usize>> {
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in 0..graph.len() {
        if !tarjan.index.contains_key(&v) {
            tarjan.visit(v);
        }
    }
    let mut found: Vec<Vec<usize>> = tarjan
        .found
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut c| {
            c.sort_unstable();
            c
        })
        .collect();
    found.sort();
    found
}

/// Tarjan's algorithm (recursive: module graphs are small).
struct Tarjan<'g> {
    graph: &'g Graph,
    index: BTreeMap<usize, usize>,
    low: BTreeMap<usize, usize>,
    stack: Vec<usize>,
    found: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        let i = self.index.len();
        self.index.insert(v, i);
        self.low.insert(v, i);
        self.stack.push(v);
        for &w in &self.graph[v] {
            if !self.index.contains_key(&w) {
                self.visit(w);
                let low = self.low[&v].min(self.low[&w]);
                self.low.insert(v, low);
            } else if self.stack.contains(&w) {
                let low = self.low[&v].min(self.index[&w]);
                self.low.insert(v, low);
            }
        }
        if self.low[&v] == self.index[&v] {
            let at = self.stack.iter().rposition(|&w| w == v).unwrap_or(0);
            self.found.push(self.stack.split_off(at));
        }
    }
}

/// A shortest cycle inside `component` (nodes in order, first node repeated at the end),
/// starting from the earliest node of `component` that lies on one.
pub(crate) fn shortest_cycle(graph: &Graph, component: &[usize]) -> Vec<usize> {
    let inside: BTreeSet<usize> = component.iter().copied().collect();
    let mut best: Vec<usize> = Vec::new();
    for &start in component {
        let mut parent: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        'bfs: while let Some(v) = queue.pop_front() {
            for &w in graph[v].iter().filter(|w| inside.contains(w)) {
                if w == start {
                    let mut back = Vec::new();
                    let mut at = v;
                    while at != start {
                        back.push(at);
                        at = parent[&at];
                    }
                    let mut cycle = vec![start];
                    cycle.extend(back.into_iter().rev());
                    cycle.push(start);
                    if best.is_empty() || cycle.len() < best.len() {
                        best = cycle;
                    }
                    break 'bfs;
                }
                if w != start && !parent.contains_key(&w) {
                    parent.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
    }
    best
}
