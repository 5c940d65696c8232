//! Why the signaling socket failed, in words: in browsers, ws_stream_wasm's error prints its
//! `CloseEvent` with Rust's Debug formatting, which a page must never show.

use matchbox_socket::SignalingError;

/// The innermost signaling error, described without Debug text.
pub(super) fn signaling_cause(error: &SignalingError) -> String {
    match error {
        SignalingError::NegotiationFailed(inner) => signaling_cause(inner),
        other => platform::describe(other),
    }
}

/// A WebSocket close code and reason as a sentence (RFC 6455 section 7.4.1 names the codes).
/// Only browsers see close events; natively its unit test is its one caller.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub(super) fn close_sentence(code: u16, reason: &str) -> String {
    let meaning = match code {
        1000 => "a normal close",
        1001 => "the server is going away",
        1002 => "a protocol error",
        1003 => "data the server does not accept",
        1006 => "no reason given: the server is unreachable, refused the connection or dropped it",
        1008 => "the server's policy refused it",
        1009 => "a message too big",
        1011 => "an error inside the server",
        1015 => "the TLS handshake failed",
        _ => "an unusual code",
    };
    let reason = reason.trim();
    if reason.is_empty() {
        format!("the signaling server closed the connection (code {code}: {meaning})")
    } else {
        let reason: String = reason.chars().take(123).collect();
        format!("the signaling server closed the connection (code {code}: {meaning}; it said \"{reason}\")")
    }
}

#[cfg(target_arch = "wasm32")]
mod platform {
    use matchbox_socket::SignalingError;
    use ws_stream_wasm::WsErr;

    pub(super) fn describe(error: &SignalingError) -> String {
        match error {
            SignalingError::WebSocket(WsErr::ConnectionFailed { event }) => {
                super::close_sentence(event.code, &event.reason)
            }
            SignalingError::WebSocket(WsErr::InvalidUrl { supplied }) => {
                format!("the browser refused the signaling address {supplied}")
            }
            other => other.to_string(),
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod platform {
    use matchbox_socket::SignalingError;

    pub(super) fn describe(error: &SignalingError) -> String {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::close_sentence;

    #[test]
    fn close_codes_read_as_sentences() {
        let abnormal = close_sentence(1006, "");
        assert!(
            abnormal.contains("code 1006: no reason given"),
            "{abnormal}"
        );
        let said = close_sentence(1008, " room full ");
        assert!(said.ends_with("it said \"room full\")"), "{said}");
        assert!(!said.contains('{'), "{said}");
    }
}
