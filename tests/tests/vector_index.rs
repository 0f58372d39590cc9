//! The vector index a search across people reads (issue 42): pgvector's IVFFlat, built by the
//! embedding worker from the vectors there and built again, beside the old one, when the
//! vectors have outgrown its lists. Searches are answered through it, before and after each
//! rebuild (not checked during one); one process builds at a time.
use std::time::Duration;

use futures::future::BoxFuture;
use switchboard_e2e::{FakeModel, TestApp, spawn_app_configured};
use switchboard_embed::Kept;
use switchboard_embed::vector_index::{self, IndexState};
use switchboard_memory::embed::{EmbedError, Embedder, pg_vector};
use switchboard_memory::search::{self, QueryVector, SearchQuery};

const MODEL: &str = "fake-embed";
const DIMS: usize = 16;

async fn state(app: &TestApp) -> IndexState {
    vector_index::index_state(&app.db, MODEL)
        .await
        .expect("the index's state")
}

/// The vector of message `k` of [`log_with_vectors`]: its own direction, far from the others'.
fn vector_of(k: i32) -> Vec<f32> {
    (0..DIMS as i32)
        .map(|d| ((k * (d + 1)) as f64 * 0.37).cos() as f32)
        .collect()
}

/// Log messages `first..first + n` of an existing session ("bulk message k") with their vectors
/// ([`vector_of`]), as the log and embedding workers would.
async fn log_with_vectors(app: &TestApp, first: i32, n: i32) {
    let vectors: Vec<String> = (first..first + n)
        .map(|k| pg_vector(&vector_of(k)))
        .collect();
    sqlx::query(
        "WITH src AS (SELECT * FROM switchboard.messages WHERE direction = 'inbound' LIMIT 1),
              new AS (
                INSERT INTO switchboard.messages
                    (id, session_id, person_id, agent_name, agent_identity, direction, channel,
                     message, correlation_id, metadata, embedded_model)
                SELECT gen_random_uuid(), src.session_id, src.person_id, src.agent_name,
                       src.agent_identity, 'inbound', src.channel, 'bulk message ' || (k + $1),
                       'test', '{}', $2
                  FROM src, generate_series(0, cardinality($3::text[]) - 1) AS k
                RETURNING id, person_id, agent_identity, message)
         INSERT INTO switchboard.message_vectors
             (message_id, model, person_id, agent_identity, dimensions, embedding)
         SELECT id, $2, person_id, agent_identity, 16,
                ($3::text[])[substring(message from 14)::int - $1 + 1]::vector
           FROM new",
    )
    .bind(first)
    .bind(MODEL)
    .bind(&vectors)
    .execute(&app.db)
    .await
    .expect("log messages with vectors");
    // As autovacuum does after such growth: the keeper reads the table's row estimate first.
    sqlx::query("ANALYZE switchboard.message_vectors")
        .execute(&app.db)
        .await
        .expect("analyze");
}

fn across_people(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        limit: 5,
        probes: 20,
        ..Default::default()
    }
}

/// A query for message `k`'s vector.
fn query_for(k: i32) -> QueryVector {
    QueryVector {
        vector: Some(pg_vector(&vector_of(k))),
        dimensions: DIMS,
        error: None,
    }
}

/// The names of every index over the fake model's vectors.
async fn indexes_of_the_model(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
          WHERE tablename = 'message_vectors' AND indexdef LIKE '%fake-embed%' ORDER BY 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// Keep the index, and see it built with `lists`: by this call, or (once a minute) by the
/// embedding worker's own keeper holding the lock at that moment.
async fn rebuilt(app: &TestApp, lists: u32) -> Kept {
    let kept = switchboard_embed::keep_index(&app.db, MODEL, DIMS)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while state(app).await != IndexState::Lists(lists) {
        assert!(
            kept == Kept::AsItWas && tokio::time::Instant::now() < deadline,
            "{kept:?}, {:?}",
            state(app).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kept
}

/// An app embedding through a fake model, after `phone` texted once, with the index its
/// embedding worker built at start, over what was there: one list.
async fn app_with_its_first_index(phone: &str) -> (FakeModel, TestApp) {
    let fake = FakeModel::start(DIMS).await;
    let config = fake.embedding_config(MODEL);
    let app = spawn_app_configured(move |c| c.embedding = config).await;
    app.text_and_settle(&[(phone, "when is my next shift")])
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while state(&app).await != IndexState::Lists(1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            state(&app).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (fake, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_is_built_from_the_vectors_and_again_when_they_outgrow_it_and_searches_read_it() {
    let (_fake, app) = app_with_its_first_index("+14155550901").await;

    log_with_vectors(&app, 1, 2_100).await;
    let kept = rebuilt(&app, 2).await;
    assert!(
        matches!(kept, Kept::Built { lists: 2, rows } if rows >= 2_100) || kept == Kept::AsItWas,
        "2,100 vectors want 2 lists: {kept:?}"
    );
    assert_eq!(
        indexes_of_the_model(&app).await,
        ["message_vectors_ivf_fake_embed"],
        "the new index took the old one's place"
    );
    assert_eq!(
        switchboard_embed::keep_index(&app.db, MODEL, DIMS)
            .await
            .unwrap(),
        Kept::AsItWas,
        "the index fits its vectors: not built again"
    );

    // The search across people is answered through the index (the statement's expression is
    // the index's), and finds the message whose vector it asks for.
    let q = across_people("nothing matches these words");
    let plan = explain(&app, &q, 1_234).await;
    assert!(plan.contains("message_vectors_ivf_fake_embed"), "{plan}");
    let found = search::search_by(&app.db, query_for(1_234), MODEL, &q)
        .await
        .unwrap();
    let top = &found.hits[0];
    assert_eq!(top.text, "bulk message 1234", "{:?}", found.hits);
    assert!(top.by_meaning);

    // 4,000 more: 6,101 vectors want 6 lists; two builders at once, one builds.
    log_with_vectors(&app, 2_101, 4_000).await;
    let (a, b) = tokio::join!(
        switchboard_embed::keep_index(&app.db, MODEL, DIMS),
        switchboard_embed::keep_index(&app.db, MODEL, DIMS)
    );
    let built: Vec<Kept> = [a.unwrap(), b.unwrap()]
        .into_iter()
        .filter(|k| *k != Kept::AsItWas)
        .collect();
    assert!(
        matches!(built[..], [Kept::Built { lists: 6, .. }] | []),
        "at most one build: {built:?}"
    );
    rebuilt(&app, 6).await;
    for k in [1_234, 5_000] {
        let found = search::search_by(&app.db, query_for(k), MODEL, &q)
            .await
            .unwrap();
        assert_eq!(found.hits[0].text, format!("bulk message {k}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_graph_is_replaced_and_a_half_done_build_is_not_left_behind() {
    let (_fake, app) = app_with_its_first_index("+14155550902").await;
    // As an earlier version left it: the model's HNSW graph, no IVFFlat index, and a build cut
    // off half way (an index left by a crashed CREATE INDEX CONCURRENTLY is invalid; this one
    // is valid, which the next build must drop all the same).
    for ddl in [
        "DROP INDEX switchboard.message_vectors_ivf_fake_embed",
        "CREATE INDEX message_vectors_hnsw_fake_embed ON switchboard.message_vectors
             USING hnsw ((embedding::halfvec(16)) halfvec_cosine_ops) WHERE model = 'fake-embed'",
        "CREATE INDEX message_vectors_ivf_fake_embed_next ON switchboard.message_vectors
             USING ivfflat ((embedding::halfvec(16)) halfvec_cosine_ops) WITH (lists = 3)
             WHERE model = 'fake-embed'",
    ] {
        sqlx::query(ddl).execute(&app.db).await.unwrap();
    }
    assert_eq!(state(&app).await, IndexState::Graph);
    let kept = switchboard_embed::keep_index(&app.db, MODEL, DIMS)
        .await
        .unwrap();
    assert!(matches!(kept, Kept::Built { lists: 1, .. }), "{kept:?}");
    assert_eq!(
        indexes_of_the_model(&app).await,
        ["message_vectors_ivf_fake_embed"]
    );
}

/// An embedder that answers one vector for any text.
struct OneVector(Vec<f32>);

impl Embedder for OneVector {
    fn model(&self) -> &str {
        MODEL
    }
    fn dimensions(&self) -> usize {
        DIMS
    }
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move { Ok(texts.iter().map(|_| self.0.clone()).collect()) })
    }
}

/// The plan of a search across people for message `k`'s vector, as the product runs it.
async fn explain(app: &TestApp, q: &SearchQuery, k: i32) -> String {
    let embedder = OneVector(vector_of(k));
    search::explain(&app.db, Ok(&embedder), MODEL, q)
        .await
        .expect("the plan")
}
