//! The model folder's tokenizer, set up as sentence-transformers uses it for all-MiniLM-L6-v2,
//! shared by both local runtimes so their vectors stay interchangeable.
use std::path::Path;

use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::EmbedError;

/// Longer inputs are cut here, as sentence-transformers does for this model.
pub const MAX_TOKENS: usize = 256;

/// `dir`'s `tokenizer.json`, cutting at [`MAX_TOKENS`] and padding a batch to its longest text.
pub fn load(dir: &Path) -> Result<Tokenizer, EmbedError> {
    let unusable = |e: &dyn std::fmt::Display| {
        EmbedError::Unusable(format!("{}: tokenizer.json: {e}", dir.display()))
    };
    let mut tokenizer =
        Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| unusable(&e))?;
    // The shipped tokenizer pads every input to 128 tokens (about 5x slower on short
    // messages) and cuts at 128: pad to the batch's longest instead, cut at 256.
    let padding = PaddingParams {
        strategy: PaddingStrategy::BatchLongest,
        ..tokenizer.get_padding().cloned().unwrap_or_default()
    };
    tokenizer.with_padding(Some(padding));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length: MAX_TOKENS,
            ..Default::default()
        }))
        .map_err(|e| unusable(&e))?;
    Ok(tokenizer)
}
