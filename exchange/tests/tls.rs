//! With a certificate and key the gateway speaks wss:// only: a TLS client
//! that trusts the certificate logs in and trades as usual, a plain ws://
//! client gets no WebSocket at all, and the exchange keeps serving.

mod common;

use std::sync::Arc;

use common::*;
use ed25519_dalek::Signer;
use futures_util::{SinkExt, StreamExt};
use gpux_engine::Role;
use gpux_protocol::*;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::tungstenite::Message;

async fn next(socket: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin)) -> ServerMessage {
    loop {
        match socket.next().await.expect("open").expect("frame") {
            Message::Text(text) => return decode_server_text(&text).expect("decodes"),
            _ => continue,
        }
    }
}

#[tokio::test]
async fn a_tls_listener_serves_wss_and_refuses_plain_websockets() {
    let dir = tempfile::tempdir().expect("temp dir");
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let certificate_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&certificate_path, identity.cert.pem()).expect("write cert");
    std::fs::write(&key_path, identity.signing_key.serialize_pem()).expect("write key");
    let exchange = Exchange::start_with(
        &dir.path().join("data"),
        None,
        &["--tls-cert", certificate_path.to_str().expect("utf-8"), "--tls-key", key_path.to_str().expect("utf-8")],
    );

    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.cert.der().clone()).expect("trust the test certificate");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(&exchange.addr).await.expect("tcp");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let (mut socket, _) = tokio_tungstenite::client_async("wss://localhost/", tls).await.expect("websocket over TLS");
    let ServerMessage::Challenge { nonce, .. } = next(&mut socket).await else { panic!("challenge") };
    let nonce: [u8; 32] = hex::decode(nonce).expect("hex").try_into().expect("32 bytes");
    let signing = key(7);
    let auth = ClientMessage::Auth {
        id: 1,
        public_key: hex::encode(signing.verifying_key().to_bytes()),
        signature: hex::encode(signing.sign(&auth_payload(&nonce)).to_bytes()),
        role: Some(Role::Renter),
        cancel_on_disconnect: false,
    };
    socket.send(Message::Text(encode_client_text(&auth).into())).await.expect("send");
    loop {
        match next(&mut socket).await {
            ServerMessage::Authenticated { role, .. } => {
                assert_eq!(role, Role::Renter);
                break;
            }
            ServerMessage::Private { .. } => continue,
            other => panic!("{other:?}"),
        }
    }

    let plain = tokio_tungstenite::connect_async(format!("ws://{}", exchange.addr)).await;
    assert!(plain.is_err(), "a plain WebSocket handshake must fail on a TLS listener");
    socket.send(Message::Text(encode_client_text(&ClientMessage::Ping { id: 2 }).into())).await.expect("send");
    assert!(matches!(next(&mut socket).await, ServerMessage::Pong { .. }), "the exchange keeps serving");
}
