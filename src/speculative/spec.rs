//! Which draft a generation speculates with, in one place for every front end: a [`DraftKind`]
//! is what a request names (one of the loaded drafts, alone or merged with the n-gram, or none),
//! a [`DraftSpec`] what a user names to load one (`wgspec --draft`, `wgspec serve --draft`):
//! both parsed ([`FromStr`]) and printed ([`fmt::Display`]) here, and a spec's kind is the kind
//! its requests use by default ([`DraftSpec::kind`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu::MAX_TOP_K;
use crate::{Error, Result};

/// Which draft a request speculates with (its JSON name: [`DraftKind::name`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftKind {
    /// The loaded draft model: its chains, or its top-k trees where it was loaded for them
    /// ([`DraftSpec::Model`]'s `tree`).
    Model,
    /// N-gram lookup in the prompt and the text so far (the latest match's continuation).
    Ngram,
    /// The loaded draft model's chain and the n-gram continuations merged into one token tree
    /// (SpecInfer's ensemble; greedy decoding, else the model's chain).
    #[serde(rename = "model+ngram")]
    ModelNgram,
    /// The loaded Medusa heads: a token tree from their top guesses.
    Medusa,
    /// The Medusa heads' tree and the n-gram continuations merged (the ensemble).
    #[serde(rename = "medusa+ngram")]
    MedusaNgram,
    /// The loaded EAGLE head: EAGLE-2's dynamic tree of its best-scoring guesses.
    Eagle,
    /// The EAGLE head's tree and the n-gram continuations merged (the ensemble).
    #[serde(rename = "eagle+ngram")]
    EagleNgram,
    /// No speculation: plain target decoding.
    #[default]
    None,
}

impl DraftKind {
    /// Every kind, in the order of the docs.
    pub const ALL: [DraftKind; 8] = [
        DraftKind::Model,
        DraftKind::Ngram,
        DraftKind::ModelNgram,
        DraftKind::Medusa,
        DraftKind::MedusaNgram,
        DraftKind::Eagle,
        DraftKind::EagleNgram,
        DraftKind::None,
    ];

    /// The loaded draft an ensemble kind merges the n-gram with (`EagleNgram` -> `Eagle`), or
    /// the kind itself.
    pub fn base(self) -> DraftKind {
        match self {
            DraftKind::ModelNgram => DraftKind::Model,
            DraftKind::MedusaNgram => DraftKind::Medusa,
            DraftKind::EagleNgram => DraftKind::Eagle,
            d => d,
        }
    }

    /// The kind with the n-gram's continuations merged in (`Eagle` -> `EagleNgram`; the n-gram
    /// alone where there is nothing else).
    pub fn with_ngram(self) -> DraftKind {
        match self.base() {
            DraftKind::Model => DraftKind::ModelNgram,
            DraftKind::Medusa => DraftKind::MedusaNgram,
            DraftKind::Eagle => DraftKind::EagleNgram,
            _ => DraftKind::Ngram,
        }
    }

    /// Whether the kind merges a loaded draft with the n-gram (an ensemble).
    pub fn is_ensemble(self) -> bool {
        self != self.base()
    }

    /// The name requests use (`"eagle+ngram"`), as serde writes it.
    pub fn name(self) -> &'static str {
        match self {
            DraftKind::Model => "model",
            DraftKind::Ngram => "ngram",
            DraftKind::ModelNgram => "model+ngram",
            DraftKind::Medusa => "medusa",
            DraftKind::MedusaNgram => "medusa+ngram",
            DraftKind::Eagle => "eagle",
            DraftKind::EagleNgram => "eagle+ngram",
            DraftKind::None => "none",
        }
    }
}

impl fmt::Display for DraftKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DraftKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<DraftKind> {
        DraftKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = DraftKind::ALL.iter().map(|k| k.name()).collect();
            Error::InvalidArgument(format!("unknown draft {s:?}; known: {}", names.join(", ")))
        })
    }
}

/// What to load to draft with, as a user names it:
///
/// | spec | loads | requests draft by default with |
/// |---|---|---|
/// | `none` | nothing | no speculation |
/// | `ngram` | nothing (prompt lookup) | `ngram` |
/// | `MODEL` | a draft model (a file, a folder or a known name) | `model`: its chains |
/// | `tree:N:MODEL` | a draft model | `model`: its N most likely tokens at each depth |
/// | `medusa:PATH` | Medusa heads | `medusa` |
/// | `eagle:PATH` | an EAGLE head | `eagle` |
///
/// Each spec that loads something may end in `+ngram`: its proposals merged with the n-gram's
/// continuations (`eagle:PATH+ngram` drafts with `eagle+ngram` by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DraftSpec {
    #[default]
    None,
    Ngram,
    /// A draft model; `tree` tokens at each depth (1: chains).
    Model {
        model: String,
        tree: usize,
        ngram: bool,
    },
    Medusa {
        path: String,
        ngram: bool,
    },
    Eagle {
        path: String,
        ngram: bool,
    },
}

impl DraftSpec {
    /// The kind requests use by default once this spec is loaded.
    pub fn kind(&self) -> DraftKind {
        let (base, ngram) = match self {
            DraftSpec::None => return DraftKind::None,
            DraftSpec::Ngram => return DraftKind::Ngram,
            DraftSpec::Model { ngram, .. } => (DraftKind::Model, *ngram),
            DraftSpec::Medusa { ngram, .. } => (DraftKind::Medusa, *ngram),
            DraftSpec::Eagle { ngram, .. } => (DraftKind::Eagle, *ngram),
        };
        if ngram {
            base.with_ngram()
        } else {
            base
        }
    }

    /// The file, folder or name of what the spec loads (none for `none` and `ngram`).
    pub fn source(&self) -> Option<&str> {
        match self {
            DraftSpec::None | DraftSpec::Ngram => None,
            DraftSpec::Model { model, .. } => Some(model),
            DraftSpec::Medusa { path, .. } | DraftSpec::Eagle { path, .. } => Some(path),
        }
    }
}

impl FromStr for DraftSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<DraftSpec> {
        let bad = |why: &str| Error::InvalidArgument(format!("draft {s:?}: {why}"));
        let (rest, ngram) = match s.strip_suffix("+ngram") {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        let named = |what: &str| match what.is_empty() {
            true => Err(bad("names no file or model")),
            false => Ok(what.to_string()),
        };
        match rest {
            "none" | "ngram" | "" if ngram => Err(bad("`+ngram` follows a draft model or heads")),
            "none" => Ok(DraftSpec::None),
            "ngram" => Ok(DraftSpec::Ngram),
            _ => {
                if let Some(path) = rest.strip_prefix("medusa:") {
                    return Ok(DraftSpec::Medusa { path: named(path)?, ngram });
                }
                if let Some(path) = rest.strip_prefix("eagle:") {
                    return Ok(DraftSpec::Eagle { path: named(path)?, ngram });
                }
                if let Some(tree) = rest.strip_prefix("tree:") {
                    let (n, model) = tree.split_once(':').ok_or_else(|| bad("a tree is `tree:N:MODEL`"))?;
                    let tree = n
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_TOP_K).contains(n))
                        .ok_or_else(|| bad(&format!("a tree's tokens per depth are 1 to {MAX_TOP_K}")))?;
                    return Ok(DraftSpec::Model { model: named(model)?, tree, ngram });
                }
                Ok(DraftSpec::Model { model: named(rest)?, tree: 1, ngram })
            }
        }
    }
}

impl fmt::Display for DraftSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ngram = match self {
            DraftSpec::None => return f.write_str("none"),
            DraftSpec::Ngram => return f.write_str("ngram"),
            DraftSpec::Model { model, tree: 1, ngram } => {
                f.write_str(model)?;
                ngram
            }
            DraftSpec::Model { model, tree, ngram } => {
                write!(f, "tree:{tree}:{model}")?;
                ngram
            }
            DraftSpec::Medusa { path, ngram } => {
                write!(f, "medusa:{path}")?;
                ngram
            }
            DraftSpec::Eagle { path, ngram } => {
                write!(f, "eagle:{path}")?;
                ngram
            }
        };
        if *ngram {
            f.write_str("+ngram")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_its_name_as_serde_writes_it() {
        for kind in DraftKind::ALL {
            assert_eq!(kind.name().parse::<DraftKind>().ok(), Some(kind));
            assert_eq!(serde_json::to_string(&kind).ok(), Some(format!("\"{kind}\"")));
            assert_eq!(
                kind.with_ngram().base(),
                if kind.base() == DraftKind::None { DraftKind::Ngram } else { kind.base() }
            );
        }
        assert!("ensemble".parse::<DraftKind>().is_err());
    }

    #[test]
    fn specs_parse_print_and_name_their_kind() {
        let model = |m: &str, tree, ngram| DraftSpec::Model { model: m.into(), tree, ngram };
        let cases = [
            ("none", DraftSpec::None, DraftKind::None),
            ("ngram", DraftSpec::Ngram, DraftKind::Ngram),
            ("qwen2.5-coder-0.5b", model("qwen2.5-coder-0.5b", 1, false), DraftKind::Model),
            ("d.gguf+ngram", model("d.gguf", 1, true), DraftKind::ModelNgram),
            ("tree:3:d.gguf", model("d.gguf", 3, false), DraftKind::Model),
            ("tree:4:C:\\m\\d.gguf+ngram", model("C:\\m\\d.gguf", 4, true), DraftKind::ModelNgram),
            ("medusa:heads/", DraftSpec::Medusa { path: "heads/".into(), ngram: false }, DraftKind::Medusa),
            ("medusa:h+ngram", DraftSpec::Medusa { path: "h".into(), ngram: true }, DraftKind::MedusaNgram),
            ("eagle:e", DraftSpec::Eagle { path: "e".into(), ngram: false }, DraftKind::Eagle),
            ("eagle:e+ngram", DraftSpec::Eagle { path: "e".into(), ngram: true }, DraftKind::EagleNgram),
        ];
        for (text, spec, kind) in cases {
            let parsed: DraftSpec = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed, spec, "{text}");
            assert_eq!(parsed.kind(), kind, "{text}");
            assert_eq!(parsed.to_string(), text, "{text}");
        }
        // `tree:1:` is the chain, printed as the model alone
        assert_eq!("tree:1:d".parse::<DraftSpec>().map(|s| s.to_string()).ok().as_deref(), Some("d"));
    }

    #[test]
    fn malformed_specs_are_refused_naming_the_problem() {
        for (text, why) in [
            ("", "names no file"),
            ("+ngram", "follows a draft model"),
            ("ngram+ngram", "follows a draft model"),
            ("none+ngram", "follows a draft model"),
            ("medusa:", "names no file"),
            ("eagle:+ngram", "names no file"),
            ("tree:3", "tree:N:MODEL"),
            ("tree:0:d", "1 to"),
            ("tree:x:d", "1 to"),
            ("tree:99:d", "1 to"),
            ("tree:2:", "names no file"),
        ] {
            let err = text.parse::<DraftSpec>().expect_err(text).to_string();
            assert!(err.contains(why) && err.contains(&format!("{text:?}")), "{text}: {err}");
        }
    }
}
