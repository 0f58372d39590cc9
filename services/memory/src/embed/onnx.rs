//! The local provider on ONNX Runtime: the default runtime when `[embedding] onnx_runtime` and
//! `onnx_model` are set (`target/debug/stack env <name>` prints both), about twice candle's and
//! PyTorch's speed on short messages (docs/embedding-runtime.md).
//!
//! - The runtime is `libonnxruntime.so` from the pinned `onnxruntime` wheel, loaded at run time
//!   (`ort`'s `load-dynamic`). Its version is read before `ort` touches it: `ort` is built for
//!   1.31 and another version fails inside it (a panic, or worse), so it is refused here with a
//!   clear error instead.
//! - The graph (`minilm_onnx.py`, from the same safetensors candle reads) takes `input_ids` and
//!   `attention_mask` (int64, `[batch, tokens]`) and gives the finished, L2-normalised sentence
//!   vector, `sentence_embedding`; the tokenizer is the model folder's, set up as for candle, so
//!   the vectors are interchangeable with candle's (same model id).
//! - Texts run one per call, or several at once only when they have the same number of tokens:
//!   padding costs more than batching saves on short messages (the measurement's finding).
use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use futures::FutureExt;
use futures::future::BoxFuture;
use ort::environment::Environment;
use ort::session::Session;
use ort::value::Tensor;
use switchboard_kit::memory_config::EmbeddingConfig;
use tokenizers::{Encoding, Tokenizer};

use super::{EmbedError, Embedder, normalise};

/// The ONNX Runtime minor version this build's `ort` speaks (its `api-31` feature).
pub const RUNTIME_VERSION: &str = "1.31";
/// The graph's inputs and output.
pub const INPUT_IDS: &str = "input_ids";
pub const ATTENTION_MASK: &str = "attention_mask";
pub const OUTPUT: &str = "sentence_embedding";

pub struct OnnxEmbedder {
    model: Arc<Model>,
    id: String,
    batch: usize,
}

/// A loaded graph and its tokenizer, shared by every embedder of the same files in a process.
struct Model {
    /// `Session::run` takes `&mut`: one embedding at a time per model (each uses `threads`).
    session: Mutex<Session>,
    tokenizer: Tokenizer,
    dimensions: usize,
    runtime: String,
}

impl OnnxEmbedder {
    /// The embedder for `[embedding]` on ONNX Runtime. Refused (`Unusable`, with what to fix)
    /// when a path is missing, the library is not ONNX Runtime 1.31, the graph lacks the
    /// expected inputs or output, or its vectors are not `dimensions` long.
    pub fn new(config: &EmbeddingConfig) -> Result<Self, EmbedError> {
        let library = required(&config.onnx_runtime, "onnx_runtime", "libonnxruntime.so")?;
        let graph = required(&config.onnx_model, "onnx_model", "the model's .onnx graph")?;
        let dir = required(
            &config.model_dir,
            "model_dir",
            "the folder with tokenizer.json",
        )?;
        let threads = match config.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let model = load_once(library, graph, dir, threads)?;
        if model.dimensions != config.dimensions {
            return Err(EmbedError::Unusable(format!(
                "the graph {} makes vectors of {} dimensions, [embedding] dimensions = {}",
                graph.display(),
                model.dimensions,
                config.dimensions
            )));
        }
        Ok(Self {
            model,
            id: config.model.clone(),
            batch: config.batch.max(1),
        })
    }
}

impl Embedder for OnnxEmbedder {
    fn model(&self) -> &str {
        &self.id
    }
    fn dimensions(&self) -> usize {
        self.model.dimensions
    }
    fn runtime(&self) -> &str {
        &self.model.runtime
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        let model = self.model.clone();
        let texts = texts.to_vec();
        let batch = self.batch;
        // Milliseconds of CPU per message: off the async threads.
        async move {
            tokio::task::spawn_blocking(move || model.embed_all(&texts, batch))
                .await
                .map_err(|e| EmbedError::Failed(format!("the embedding task failed: {e}")))?
        }
        .boxed()
    }
}

fn required<'a>(value: &'a str, key: &str, what: &str) -> Result<&'a Path, EmbedError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(EmbedError::Unusable(format!(
            "[embedding] {key} is empty: the ONNX runtime needs {what} (`target/debug/stack env <name>` \
             prints the copies `make run`/`make test` fetch)"
        )));
    }
    Ok(Path::new(value))
}

fn canonical(path: &Path, key: &str) -> Result<PathBuf, EmbedError> {
    path.canonicalize()
        .map_err(|e| EmbedError::Unusable(format!("[embedding] {key} {}: {e}", path.display())))
}

fn load_once(
    library: &Path,
    graph: &Path,
    dir: &Path,
    threads: usize,
) -> Result<Arc<Model>, EmbedError> {
    type Key = (PathBuf, PathBuf, PathBuf, usize);
    static LOADED: OnceLock<Mutex<HashMap<Key, Arc<Model>>>> = OnceLock::new();
    let key = (
        canonical(library, "onnx_runtime")?,
        canonical(graph, "onnx_model")?,
        canonical(dir, "model_dir")?,
        threads,
    );
    // Held while loading, so stages starting together load the graph once.
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(model) = loaded.get(&key) {
        return Ok(model.clone());
    }
    let model = Arc::new(Model::load(&key.0, &key.1, &key.2, threads)?);
    loaded.insert(key, model.clone());
    Ok(model)
}

/// The process's ONNX Runtime: one library and one environment per process (ort allows no
/// second environment), so a second, different library is refused rather than ignored.
struct Runtime {
    path: PathBuf,
    version: String,
    environment: Environment,
    /// Kept open: the version check's handle on the library (ort holds its own).
    _library: libloading::Library,
}

fn runtime(path: &Path) -> Result<Arc<Runtime>, EmbedError> {
    static RUNTIME: OnceLock<Mutex<Option<Arc<Runtime>>>> = OnceLock::new();
    let mut slot = RUNTIME
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(loaded) = slot.as_ref() {
        if loaded.path == path {
            return Ok(loaded.clone());
        }
        return Err(EmbedError::Unusable(format!(
            "[embedding] onnx_runtime {}: this process already runs ONNX Runtime from {} (one \
             library per process)",
            path.display(),
            loaded.path.display()
        )));
    }
    let (library, version) = library_version(path)?;
    if !(version == RUNTIME_VERSION || version.starts_with(&format!("{RUNTIME_VERSION}."))) {
        return Err(EmbedError::Unusable(format!(
            "[embedding] onnx_runtime {} is ONNX Runtime {version}; this build needs \
             {RUNTIME_VERSION}.x (the pinned onnxruntime 1.31.1 wheel the stack tool \
             fetches), or set [embedding] runtime = \"candle\"",
            path.display()
        )));
    }
    let environment = unwound(|| {
        ort::init_from(path)
            .map_err(|e| e.to_string())?
            .with_name("switchboard")
            .with_telemetry(false)
            .build()
            .map_err(|e| e.to_string())
    })
    .map_err(|e| {
        EmbedError::Unusable(format!(
            "[embedding] onnx_runtime {}: ONNX Runtime did not start: {e}",
            path.display()
        ))
    })?;
    let runtime = Arc::new(Runtime {
        path: path.to_path_buf(),
        version,
        environment,
        _library: library,
    });
    *slot = Some(runtime.clone());
    Ok(runtime)
}

/// The library at `path`, opened, and the version it reports (`OrtGetApiBase()->
/// GetVersionString()`, which every ONNX Runtime release has).
fn library_version(path: &Path) -> Result<(libloading::Library, String), EmbedError> {
    let unusable = |why: String| {
        EmbedError::Unusable(format!(
            "[embedding] onnx_runtime {}: {why}",
            path.display()
        ))
    };
    // SAFETY: loading a shared library runs its initialisers; this is the library the operator
    // configured as ONNX Runtime, which is what it is there for.
    let library = unsafe { libloading::Library::new(path) }
        .map_err(|e| unusable(format!("cannot be loaded: {e}")))?;
    type GetApiBase = unsafe extern "system" fn() -> *const ort::sys::OrtApiBase;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
    let get_base = unsafe { library.get::<GetApiBase>(b"OrtGetApiBase") }
        .map_err(|_| unusable("is not ONNX Runtime (it has no OrtGetApiBase)".into()))?;
    // SAFETY: per the C API, a pointer to a static table whose `GetVersionString` returns a
    // static, NUL-terminated string; both are checked for null.
    let version = unsafe {
        let base = get_base();
        if base.is_null() {
            return Err(unusable("OrtGetApiBase returned nothing".into()));
        }
        let version = ((*base).GetVersionString)();
        if version.is_null() {
            return Err(unusable("it reports no version".into()));
        }
        std::ffi::CStr::from_ptr(version)
            .to_string_lossy()
            .into_owned()
    };
    Ok((library, version))
}

/// `f`, with a panic inside ort turned into an error (a bad library must not take the
/// process down).
fn unwound<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(format!("ort panicked: {why}"))
    })
}

impl Model {
    fn load(library: &Path, graph: &Path, dir: &Path, threads: usize) -> Result<Self, EmbedError> {
        let runtime = runtime(library)?;
        let tokenizer = super::tokenize::load(dir)?;
        let unusable = |e: String| {
            EmbedError::Unusable(format!("[embedding] onnx_model {}: {e}", graph.display()))
        };
        let session = unwound(|| {
            let mut builder = Session::builder(&runtime.environment)
                .map_err(|e| e.to_string())?
                .with_intra_threads(threads)
                .map_err(|e| e.to_string())?
                .with_inter_threads(1)
                .map_err(|e| e.to_string())?
                // Idle threads sleep instead of spinning: the CPU is the other stages' too.
                .with_intra_op_spinning(false)
                .map_err(|e| e.to_string())?;
            builder.commit_from_file(graph).map_err(|e| e.to_string())
        })
        .map_err(unusable)?;
        for name in [INPUT_IDS, ATTENTION_MASK] {
            if !session.inputs().iter().any(|i| i.name() == name) {
                return Err(unusable(format!(
                    "the graph has no input `{name}` (a graph from minilm_onnx.py has {INPUT_IDS} \
                     and {ATTENTION_MASK})"
                )));
            }
        }
        if !session.outputs().iter().any(|o| o.name() == OUTPUT) {
            return Err(unusable(format!("the graph has no output `{OUTPUT}`")));
        }
        let mut model = Self {
            session: Mutex::new(session),
            tokenizer,
            dimensions: 0,
            runtime: format!(
                "ONNX Runtime {} ({}), {threads} thread(s)",
                runtime.version,
                runtime.path.display()
            ),
        };
        // One real run: the vector size, and proof the runtime and graph work together.
        let probe = model
            .embed_all(&["probe".to_string()], 1)
            .map_err(|e| unusable(e.to_string()))?;
        model.dimensions = probe.first().map_or(0, Vec::len);
        Ok(model)
    }

    /// One vector per text, in order. Texts with the same number of tokens run together, up
    /// to `batch` at a time; nothing is padded.
    fn embed_all(&self, texts: &[String], batch: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let failed = |e: &dyn std::fmt::Display| EmbedError::Failed(format!("ONNX embedding: {e}"));
        let encodings = texts
            .iter()
            .map(|t| self.tokenizer.encode(t.as_str(), true))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed(&e))?;
        let mut by_length: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, e) in encodings.iter().enumerate() {
            by_length.entry(e.len()).or_default().push(i);
        }
        let mut out = vec![Vec::new(); texts.len()];
        for group in by_length.values() {
            for chunk in group.chunks(batch) {
                let inputs: Vec<&Encoding> = chunk.iter().map(|&i| &encodings[i]).collect();
                for (&i, v) in chunk.iter().zip(self.run(&inputs)?) {
                    out[i] = v;
                }
            }
        }
        Ok(out)
    }

    /// One run of the graph over encodings of equal length.
    fn run(&self, encodings: &[&Encoding]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let failed = |e: &dyn std::fmt::Display| EmbedError::Failed(format!("ONNX embedding: {e}"));
        let rows = encodings.len();
        let len = encodings.first().map_or(0, |e| e.len());
        let column = |f: fn(&Encoding) -> &[u32]| -> Vec<i64> {
            encodings
                .iter()
                .flat_map(|e| f(e).iter().map(|&x| i64::from(x)))
                .collect()
        };
        let ids =
            Tensor::from_array(([rows, len], column(Encoding::get_ids))).map_err(|e| failed(&e))?;
        let mask = Tensor::from_array(([rows, len], column(Encoding::get_attention_mask)))
            .map_err(|e| failed(&e))?;
        let mut session = self
            .session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let outputs = session
            .run(ort::inputs![INPUT_IDS => ids, ATTENTION_MASK => mask])
            .map_err(|e| failed(&e))?;
        let output = outputs
            .get(OUTPUT)
            .ok_or_else(|| failed(&format!("the graph gave no `{OUTPUT}`")))?;
        let (shape, data) = output.try_extract_tensor::<f32>().map_err(|e| failed(&e))?;
        let width = shape.last().copied().unwrap_or(0).max(0) as usize;
        if width == 0 || data.len() != rows * width {
            return Err(failed(&format!(
                "`{OUTPUT}` has shape {shape:?} for {rows} text(s)"
            )));
        }
        Ok(data
            .chunks(width)
            .map(|row| {
                let mut v = row.to_vec();
                normalise(&mut v);
                v
            })
            .collect())
    }
}
