//! Media a person sends by MMS lands in the session's workspace (`attachments/`), fetched with
//! the Twilio account's credentials, capped in size, and is listed in the prompt.
use std::time::Duration;

use switchboard_e2e::{spawn_app_configured, twilio_sms_params};

const PERSON: &str = "+14155550196";
const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_picture_sent_by_mms_is_kept_in_the_workspace_and_listed_in_the_prompt() {
    let root = std::env::temp_dir().join(format!("sb-mms-{}", uuid::Uuid::new_v4().simple()));
    let root_text = root.to_string_lossy().into_owned();
    let app = spawn_app_configured(move |c| {
        c.workspace.root = root_text;
        c.workspace.max_attachment_bytes = 1_000;
    })
    .await;
    let picture: Vec<u8> = (0..700u32).map(|i| (i % 251) as u8).collect();
    let small = app.twilio.add_media("image/jpeg", picture.clone());
    let large = app.twilio.add_media("image/png", vec![7u8; 5_000]);
    let mut params = twilio_sms_params(&app.twilio.account_sid, PERSON, "look at this", "SMmms1");
    params.retain(|(k, _)| k != "NumMedia");
    params.extend([
        ("NumMedia".to_string(), "2".to_string()),
        ("MediaUrl0".to_string(), small),
        ("MediaContentType0".to_string(), "image/jpeg".to_string()),
        ("MediaUrl1".to_string(), large),
        ("MediaContentType1".to_string(), "image/png".to_string()),
    ]);
    let signature = app.sign(&params);
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&params)
        .finish();
    assert_eq!(app.post_twilio(body, Some(&signature)).await.status(), 200);
    app.wait_for_sms(1, WAIT).await;

    let call = &app.runner.calls()[0];
    let folder = std::path::PathBuf::from(call.workspace.clone().expect("a workspace"));
    let kept: Vec<_> = std::fs::read_dir(folder.join("attachments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "only the picture under the cap is kept: {kept:?}"
    );
    assert_eq!(std::fs::read(&kept[0]).unwrap(), picture);
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("-0.jpg"), "{name}");
    let p = &call.prompt;
    assert!(
        p.contains(&format!(
            "Attachment: attachments/{name} (image/jpeg, 700 B)"
        )),
        "{p}"
    );
    assert!(
        p.contains("an attachment larger than 1000 B (not kept)"),
        "{p}"
    );
    app.shutdown().await;
    let _ = std::fs::remove_dir_all(&root);
}
