//! `GET /widget.js`: the chat widget, one script tag on any page (`widget.js` beside this file
//! says how it is used). Plain JavaScript with no build step; the binary carries it, so the
//! script matches the gateway's socket and upload contracts it speaks.
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::GatewayState;

/// The script as served.
pub const WIDGET_JS: &str = include_str!("widget.js");

pub fn routes() -> Router<GatewayState> {
    Router::new().route("/widget.js", get(widget_js))
}

async fn widget_js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            // Short: a new gateway's widget reaches pages within minutes.
            (header::CACHE_CONTROL, "public, max-age=300"),
            // Any site may embed it; it acts only with the token the host page hands it.
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        WIDGET_JS,
    )
}
