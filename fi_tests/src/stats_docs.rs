//! Reading the provider's `FI_RDMX_STATS=<path>` JSON documents (one per line,
//! fi_rdmx(7), JSON documents) while an endpoint runs: what tests wait on
//! instead of sleeping, such as "the receiver refuses new messages now".
use serde_json::Value;
use std::path::Path;

/// Every document of `path`, in the order they were written. The provider
/// writes one line per document: a last line without its newline is still
/// being written and is left out; any other line that does not parse fails
/// the test.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: not a JSON document ({e}): {l}", path.display()))
        })
        .collect()
}

/// The documents of `path` whose endpoint is `uri` (its `rdmx://` address).
pub fn documents_of(path: &Path, uri: &str) -> Vec<Value> {
    documents(path).into_iter().filter(|d| d["endpoint"] == uri).collect()
}

/// Messages `doc`'s endpoint received from its first peer, by every protocol.
pub fn received_from_first_peer(doc: &Value) -> u64 {
    let r = &doc["peers"][0]["received"];
    ["eager", "rendezvous_pulled", "rendezvous_windowed"].iter().filter_map(|k| r[k]["messages"].as_u64()).sum()
}

/// The one document `uri` wrote at its close.
pub fn close_document(path: &Path, uri: &str) -> Value {
    let docs: Vec<Value> = documents_of(path, uri).into_iter().filter(|d| d["reason"] == "close").collect();
    assert_eq!(docs.len(), 1, "one close document for {uri} in {}", path.display());
    docs.into_iter().next().unwrap()
}

/// Milliseconds since the epoch, the clock of the documents' `time_ms`.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Whether `uri`'s newest document was written after `after_ms` and says it
/// refuses new messages (it holds its unexpected-message limit).
pub fn refusing_since(path: &Path, uri: &str, after_ms: u64) -> bool {
    documents_of(path, uri)
        .last()
        .is_some_and(|d| d["time_ms"].as_u64().is_some_and(|t| t > after_ms) && d["refusing_messages"] == true)
}
