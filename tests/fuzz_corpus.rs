//! Stable-Rust stand-in for the cargo-fuzz targets: runs the very same target functions
//! (`fuzz/src/targets.rs`) on the kept corpus (`fuzz/corpus/<target>/`), on the regression
//! inputs of crashes found, and on a few thousand random and mutated inputs, as a normal test.
//!
//! `FUZZ_ITERATIONS` (default 3000 per target) sets how many generated inputs; `FUZZ_SEED`
//! fixes the random seed (printed on failure). `WRITE_FUZZ_SEEDS=1` rewrites the seed files.

#[path = "../fuzz/src/targets.rs"]
mod targets;

use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect()
}

/// Flips, inserts, deletes and splices bytes, as a fuzzer's mutator would.
fn mutate(rng: &mut StdRng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        match rng.gen_range(0..6) {
            0 if !data.is_empty() => {
                let at = rng.gen_range(0..data.len());
                data[at] ^= 1 << rng.gen_range(0..8);
            }
            1 if !data.is_empty() => {
                let at = rng.gen_range(0..data.len());
                data[at] = rng.r#gen();
            }
            2 => {
                let at = rng.gen_range(0..=data.len());
                let byte = *[b'{', b'[', b'"', b'\\', 0xA5, 0x5A, 0xFF, 0]
                    .get(rng.gen_range(0..8))
                    .unwrap();
                data.insert(at, byte);
            }
            3 if !data.is_empty() => {
                let at = rng.gen_range(0..data.len());
                let end = (at + rng.gen_range(1..8)).min(data.len());
                data.drain(at..end);
            }
            4 if !other.is_empty() => {
                let from = rng.gen_range(0..other.len());
                let at = rng.gen_range(0..=data.len());
                let end = (from + rng.gen_range(1..32)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ => data.truncate(rng.gen_range(0..=data.len())),
        }
    }
    data
}

fn run(target: &str, one: fn(&[u8])) {
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "no corpus for {target}");
    for (path, bytes) in &seeds {
        let result = std::panic::catch_unwind(|| one(bytes));
        assert!(result.is_ok(), "{target} failed on {}", path.display());
    }
    let iterations: usize = std::env::var("FUZZ_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..iterations {
        let data = if i % 4 == 0 {
            let len = rng.gen_range(0..256);
            (0..len).map(|_| rng.r#gen()).collect()
        } else {
            let a = &seeds[rng.gen_range(0..seeds.len())].1;
            let b = &seeds[rng.gen_range(0..seeds.len())].1;
            mutate(&mut rng, a, b)
        };
        let result = std::panic::catch_unwind(|| one(&data));
        assert!(
            result.is_ok(),
            "{target} failed (FUZZ_SEED={seed}, iteration {i}) on {data:?}"
        );
    }
}

#[test]
fn frame_decoder_corpus_and_mutations() {
    run("frame_decoder", targets::frame_decoder);
}

#[test]
fn request_body_corpus_and_mutations() {
    run("request_body", targets::request_body);
}

/// Regression inputs, kept for good in `fuzz/regressions/<target>/`: every crash a fuzzer
/// finds goes there; until one does, the inputs behind the hostile-input fixes (a 20 000-deep
/// array, invalid UTF-8 in a key, a frame header with a sync pattern and a wild length).
#[test]
fn regressions() {
    let mut ran = 0;
    for (target, one) in [
        ("frame_decoder", targets::frame_decoder as fn(&[u8])),
        ("request_body", targets::request_body),
    ] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/regressions")
            .join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| one(&bytes));
            assert!(result.is_ok(), "{target} regression {}", path.display());
            ran += 1;
        }
    }
    assert!(ran >= 3, "only {ran} regression inputs ran");
}

/// The seed corpus: one frame of every kind from SPEC.md, and typical request bodies.
fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for example in station_protocol::spec_examples::spec_examples() {
        let bytes = example.frame().unwrap().to_bytes().unwrap();
        seeds.push(("frame_decoder", example.name.to_owned(), bytes.to_vec()));
    }
    let bodies: &[(&str, &str)] = &[
        ("value_get", r#"{"Name":"0.1.ESH10000158.MON_3V3"}"#),
        (
            "value_set",
            r#"{"name":"0.4.ESH10000662.VSET1","value":"4.998"}"#,
        ),
        (
            "value_bool",
            r#"{"Name":"0.4.ESH10000662.ON1","Value":true}"#,
        ),
        ("values_get", r#"{"Names":["A","B"],"MaxAgeMs":500}"#),
        (
            "values_set",
            r#"{"Resources":{"A":"5","B":1.5e3,"C":"Red"}}"#,
        ),
        ("lease", r#"{"Owner":"TAT station 3","TtlMs":30000}"#),
        (
            "subscription",
            r#"{"StreamId":"s1","Channels":["A"],"IntervalMs":100}"#,
        ),
        ("bytes", r#"{"Name":"X","Value":"0xDE 0xAD be ef"}"#),
        (
            "escape",
            r#"{"Name":"\u00e9\ud83d\ude00","Value":"line\\n"}"#,
        ),
        ("nested", r#"{"Name":[[[[{"a":[1,2,{"b":null}]}]]]]}"#),
        (
            "number",
            r#"{"MaxAgeMs":1e300,"TtlMs":-0.0,"IntervalMs":18446744073709551616}"#,
        ),
        ("empty", ""),
    ];
    for (name, body) in bodies {
        seeds.push(("request_body", (*name).to_owned(), body.as_bytes().to_vec()));
    }
    seeds
}

/// The committed seed corpus is exactly what `seed_corpus` makes (SPEC.md's example frames
/// change with the spec). `WRITE_FUZZ_SEEDS=1` rewrites the files instead of comparing.
#[test]
fn the_committed_seed_corpus_is_what_the_generator_makes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let write = std::env::var_os("WRITE_FUZZ_SEEDS").is_some();
    for (target, name, bytes) in seed_corpus() {
        let path = root.join(target).join(&name);
        if write {
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == bytes,
            "{} differs from the generator (WRITE_FUZZ_SEEDS=1 cargo test --test fuzz_corpus rewrites it)",
            path.display()
        );
    }
}
