//! With a certificate and key the gateway speaks wss:// only: a TLS client
//! that trusts the certificate logs in and trades as usual, a plain ws://
//! client gets no WebSocket at all, and the exchange keeps serving. The
//! console and the REST API are then HTTPS only.

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
    write_secret(&key_path, identity.signing_key.serialize_pem());
    let exchange = Exchange::start_with(
        &dir.path().join("data"),
        None,
        &[
            "--tls-cert",
            certificate_path.to_str().expect("utf-8"),
            "--tls-key",
            key_path.to_str().expect("utf-8"),
            "--console-listen",
            "127.0.0.1:0",
        ],
    );

    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.cert.der().clone()).expect("trust the test certificate");
    let config: rustls::ClientConfig = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(&exchange.addr).await.expect("tcp");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config.clone()))
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
        invite: None,
        market_data_version: None,
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

    // The REST API over HTTPS with the same identity; plain HTTP gets no answer.
    let tcp = tokio::net::TcpStream::connect(&exchange.console_addr).await.expect("tcp");
    let mut https = tokio_rustls::TlsConnector::from(Arc::new(config.clone()))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake on the console's listener");
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        https.write_all(b"GET /api/v1/instruments HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.expect("request");
        let mut response = Vec::new();
        let _ = https.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response);
        assert!(response.starts_with("HTTP/1.1 200") && response.contains("H100-SXM-80G/SPOT"), "{response}");
    }
    let (status, _) = tokio::time::timeout(std::time::Duration::from_secs(8), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut plain = tokio::net::TcpStream::connect(&exchange.console_addr).await.expect("tcp");
        let _ = plain.write_all(b"GET /api/v1/instruments HTTP/1.1\r\nHost: x\r\n\r\n").await;
        let mut response = Vec::new();
        let _ = plain.read_to_end(&mut response).await;
        (!String::from_utf8_lossy(&response).starts_with("HTTP/1.1 200"), ())
    })
    .await
    .expect("the listener closes a plain HTTP request");
    assert!(status, "plain HTTP is not served on a TLS listener");

    let plain = tokio_tungstenite::connect_async(format!("ws://{}", exchange.addr)).await;
    assert!(plain.is_err(), "a plain WebSocket handshake must fail on a TLS listener");
    socket.send(Message::Text(encode_client_text(&ClientMessage::Ping { id: 2 }).into())).await.expect("send");
    assert!(matches!(next(&mut socket).await, ServerMessage::Pong { .. }), "the exchange keeps serving");
}
