//! What a peer's signal must be before matchbox sees it: what the receiving WebRTC stack (the
//! browser's, or webrtc-rs natively) accepts for a data-channel connection. Matchbox unwraps
//! `setRemoteDescription` and `addIceCandidate`, so a signal either stack refuses would end
//! the socket (natively) or abort the wasm instance (in a page).
//!
//! The rules are JSEP's for one data channel (RFC 8829, 8839, 8122, 8841), as browsers and
//! webrtc-rs write them: one `m=application ... webrtc-datachannel` section, ICE credentials
//! of legal length, a DTLS fingerprint of the right size; candidates in RFC 8839's grammar on
//! that one section, under the ufrag of the sender's last description. Hand-written: no crate
//! validates SDP the way a browser will, and in a page only the browser's parser exists.

use std::collections::HashMap;

use matchbox_socket::{PeerId, PeerSignal};

/// Longest offer or answer accepted (a data-channel-only SDP is about 1 KiB).
const MAX_SDP_BYTES: usize = 64 << 10;
/// Longest ICE candidate accepted, as its JSON.
const MAX_CANDIDATE_BYTES: usize = 4 << 10;
/// Peers whose ICE ufrag is remembered at once: a room is a fleet, not a crowd.
const MAX_PEERS: usize = 4096;

/// The sender's ICE ufrag from its last offer or answer, which its candidates must carry.
#[derive(Default)]
pub(super) struct SignalRules {
    ufrags: HashMap<PeerId, String>,
}

impl SignalRules {
    /// Whether matchbox can take `signal` from `sender`; remembers a description's ufrag.
    pub(super) fn check(&mut self, sender: PeerId, signal: &PeerSignal) -> Result<(), String> {
        match signal {
            PeerSignal::Offer(sdp) => self
                .description(sender, sdp)
                .map_err(|r| format!("offer: {r}")),
            PeerSignal::Answer(sdp) => self
                .description(sender, sdp)
                .map_err(|r| format!("answer: {r}")),
            PeerSignal::IceCandidate(json) => {
                let ufrag = self.ufrags.get(&sender).map(String::as_str);
                check_candidate(json, ufrag).map_err(|reason| format!("ICE candidate: {reason}"))
            }
        }
    }

    fn description(&mut self, sender: PeerId, sdp: &str) -> Result<(), String> {
        let ufrag = check_sdp(sdp)?;
        if self.ufrags.len() >= MAX_PEERS && !self.ufrags.contains_key(&sender) {
            return Err(format!("more than {MAX_PEERS} peers signalling at once"));
        }
        self.ufrags.insert(sender, ufrag);
        Ok(())
    }

    pub(super) fn forget(&mut self, peer: PeerId) {
        self.ufrags.remove(&peer);
    }
}

/// Checks an offer or answer; returns its ICE ufrag.
pub(super) fn check_sdp(sdp: &str) -> Result<String, String> {
    if sdp.len() > MAX_SDP_BYTES {
        return Err(format!("{} bytes (at most {MAX_SDP_BYTES})", sdp.len()));
    }
    let mut lines = sdp.lines();
    if lines.next() != Some("v=0") {
        return Err("does not start with v=0".into());
    }
    let (mut ufrag, mut pwd, mut fingerprint) = (None, None, None);
    let (mut media, mut session_lines) = (0, Vec::new());
    for (number, line) in lines.enumerate().map(|(i, l)| (i + 2, l)) {
        let (key, value) = line
            .split_once('=')
            .filter(|(k, v)| {
                k.len() == 1 && k.bytes().all(|b| b.is_ascii_lowercase()) && !v.is_empty()
            })
            .ok_or_else(|| format!("line {number} is not <letter>=<value>"))?;
        if value.chars().any(char::is_control) {
            return Err(format!("line {number} holds a control character"));
        }
        match (key, value.split_once(':')) {
            ("m", _) => {
                check_media(value).map_err(|reason| format!("line {number}: {reason}"))?;
                media += 1;
            }
            ("a", Some(("ice-ufrag", v))) => ufrag = Some(v),
            ("a", Some(("ice-pwd", v))) => pwd = Some(v),
            ("a", Some(("fingerprint", v))) => fingerprint = Some(v),
            ("a", Some(("setup", v))) if !["actpass", "active", "passive"].contains(&v) => {
                return Err(format!(
                    "line {number}: setup {v:?} is not actpass, active or passive"
                ))
            }
            _ if media == 0 => session_lines.push(key),
            _ => {}
        }
    }
    for key in ["o", "s", "t"] {
        if !session_lines.contains(&key) {
            return Err(format!("no {key}= line before the media section"));
        }
    }
    if media != 1 {
        return Err(format!("{media} media sections (a data channel has one)"));
    }
    check_ice_chars("ice-ufrag", ufrag, 4)?;
    check_ice_chars("ice-pwd", pwd, 22)?;
    check_fingerprint(fingerprint.ok_or("no DTLS fingerprint")?)?;
    Ok(ufrag.unwrap_or_default().to_string())
}

/// `m=application <port> UDP/DTLS/SCTP webrtc-datachannel` (or over TCP).
fn check_media(value: &str) -> Result<(), String> {
    let fields: Vec<&str> = value.split(' ').collect();
    match fields.as_slice() {
        ["application", port, "UDP/DTLS/SCTP" | "TCP/DTLS/SCTP", "webrtc-datachannel"]
            if port.parse::<u16>().is_ok() =>
        {
            Ok(())
        }
        _ => Err(format!("media {value:?} is not one data channel")),
    }
}

/// RFC 8839's ice-char (ALPHA / DIGIT / "+" / "/"), `min` to 256 of them.
fn check_ice_chars(what: &str, value: Option<&str>, min: usize) -> Result<(), String> {
    let value = value.ok_or_else(|| format!("no {what}"))?;
    let legal = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !legal || !(min..=256).contains(&value.len()) {
        return Err(format!("{what} is not {min} to 256 ICE characters"));
    }
    Ok(())
}

/// `<hash> XX:XX:...`, as many bytes as the hash gives (RFC 8122).
fn check_fingerprint(value: &str) -> Result<(), String> {
    let (hash, hex) = value
        .split_once(' ')
        .ok_or("fingerprint without a hash name")?;
    let bytes = match hash.to_ascii_lowercase().as_str() {
        "sha-1" => 20,
        "sha-224" => 28,
        "sha-256" => 32,
        "sha-384" => 48,
        "sha-512" => 64,
        other => return Err(format!("fingerprint hash {other:?} is not a SHA")),
    };
    let pairs: Vec<&str> = hex.split(':').collect();
    let hex_pair = |p: &&str| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit());
    if pairs.len() != bytes || !pairs.iter().all(hex_pair) {
        return Err(format!("fingerprint is not {bytes} hex bytes"));
    }
    Ok(())
}

/// Checks a candidate's JSON (`RTCIceCandidateInit`; `null` ends the candidates).
pub(super) fn check_candidate(json: &str, sender_ufrag: Option<&str>) -> Result<(), String> {
    if json.len() > MAX_CANDIDATE_BYTES {
        return Err(format!(
            "{} bytes (at most {MAX_CANDIDATE_BYTES})",
            json.len()
        ));
    }
    let fields = match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Null) => return Ok(()),
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => return Err("not a JSON object".into()),
    };
    let candidate = fields
        .get("candidate")
        .and_then(|c| c.as_str())
        .ok_or("no candidate string")?;
    let mid = fields.get("sdpMid").filter(|v| !v.is_null());
    let index = fields.get("sdpMLineIndex").filter(|v| !v.is_null());
    let mid_ok = mid.is_none_or(|m| m == "" || m == "0");
    let index_ok = index.is_none_or(|i| i == 0);
    if !mid_ok || !index_ok || (mid.is_none_or(|m| m != "0") && index.is_none()) {
        return Err("not for the one media section (sdpMid \"0\" or sdpMLineIndex 0)".into());
    }
    match fields.get("usernameFragment").filter(|v| !v.is_null()) {
        None => {}
        Some(u) if u == "" => {}
        Some(u) if sender_ufrag.is_some_and(|s| u == s) => {}
        Some(_) => return Err("usernameFragment is not the sender's ICE ufrag".into()),
    }
    if candidate.is_empty() {
        return Ok(());
    }
    check_candidate_line(candidate)
}

/// RFC 8839's candidate-attribute: foundation, component, transport, priority, address,
/// port, `typ` and a type, then name-value extensions.
fn check_candidate_line(line: &str) -> Result<(), String> {
    let body = line
        .strip_prefix("candidate:")
        .ok_or("does not start with candidate:")?;
    let fields: Vec<&str> = body.split(' ').collect();
    let [foundation, component, transport, priority, address, port, typ, kind, rest @ ..] =
        fields.as_slice()
    else {
        return Err("fewer than 8 fields".into());
    };
    let ice_chars = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    };
    let hostname = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b))
            && s.len() <= 253
    };
    let checks = [
        (
            !foundation.is_empty() && foundation.len() <= 32 && ice_chars(foundation),
            "foundation",
        ),
        (component.parse::<u16>().is_ok_and(|c| c >= 1), "component"),
        (
            ["udp", "tcp"].contains(&transport.to_ascii_lowercase().as_str()),
            "transport",
        ),
        (priority.parse::<u32>().is_ok(), "priority"),
        (!address.is_empty() && hostname(address), "address"),
        (port.parse::<u16>().is_ok(), "port"),
        (
            *typ == "typ" && ["host", "srflx", "prflx", "relay"].contains(kind),
            "type",
        ),
        (
            rest.len() % 2 == 0 && rest.iter().all(|f| !f.is_empty()),
            "extensions",
        ),
    ];
    match checks.iter().find(|(ok, _)| !ok) {
        Some((_, field)) => Err(format!("its {field} is malformed")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINGERPRINT: &str = "sha-256 8C:71:B2:5A:0F:35:D4:3A:97:E6:00:11:22:33:44:55:\
                               66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33:44:55";

    fn sdp(media: &str, fingerprint: &str) -> String {
        format!(
            "v=0\r\no=- 1 2 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n\
             m={media}\r\nc=IN IP4 0.0.0.0\r\na=ice-ufrag:abcd\r\n\
             a=ice-pwd:abcdefghijklmnopqrstuv\r\na=fingerprint:{fingerprint}\r\n\
             a=setup:actpass\r\na=mid:0\r\na=sctp-port:5000\r\n"
        )
    }

    const MEDIA: &str = "application 9 UDP/DTLS/SCTP webrtc-datachannel";

    #[test]
    fn a_data_channel_description_passes_and_gives_its_ufrag() {
        assert_eq!(check_sdp(&sdp(MEDIA, FINGERPRINT)).unwrap(), "abcd");
    }

    #[test]
    fn descriptions_a_browser_refuses_are_named() {
        let cases = [
            ("garbage \u{0}".to_string(), "v=0"),
            (sdp(MEDIA, "sha-256 8C:71"), "32 hex bytes"),
            (sdp(MEDIA, "md5 8C:71"), "not a SHA"),
            (
                sdp("audio 9 UDP/TLS/RTP/SAVPF 111", FINGERPRINT),
                "not one data channel",
            ),
            (
                sdp(MEDIA, FINGERPRINT).replace("a=fingerprint", "a=x-fingerprint"),
                "no DTLS",
            ),
            (
                sdp(MEDIA, FINGERPRINT)
                    .replace("a=ice-pwd:abcdefghijklmnopqrstuv", "a=ice-pwd:short"),
                "ice-pwd",
            ),
            (sdp(MEDIA, FINGERPRINT).replace("s=-\r\n", ""), "no s="),
            (
                sdp(MEDIA, FINGERPRINT).replace("actpass", "sideways"),
                "setup",
            ),
            (
                sdp(MEDIA, FINGERPRINT) + "m=" + MEDIA + "\r\n",
                "2 media sections",
            ),
            ("x".repeat(MAX_SDP_BYTES + 1), "at most"),
        ];
        for (sdp, reason) in cases {
            let error = check_sdp(&sdp).expect_err(reason);
            assert!(error.contains(reason), "{error:?} should say {reason:?}");
        }
    }

    #[test]
    fn candidates_from_browsers_and_webrtc_rs_pass() {
        let ok = [
            "null",
            r#"{"candidate":"candidate:842163049 1 udp 1677729535 192.0.2.3 54321 typ srflx raddr 0.0.0.0 rport 0 generation 0","sdpMid":"0","sdpMLineIndex":0,"usernameFragment":"abcd"}"#,
            r#"{"candidate":"candidate:1 1 UDP 2130706431 3e0c6a1c-4b3a-4b1e.local 5000 typ host","sdpMid":"","sdpMLineIndex":0,"usernameFragment":null,"url":null}"#,
            r#"{"candidate":"","sdpMid":"0"}"#,
        ];
        for json in ok {
            check_candidate(json, Some("abcd")).unwrap_or_else(|e| panic!("{json}: {e}"));
        }
    }

    #[test]
    fn candidates_a_browser_refuses_are_named() {
        let cases = [
            ("{not json", "not a JSON object"),
            (r#"{"candidate": 42}"#, "no candidate string"),
            (r#"{"candidate":"garbage","sdpMid":"0"}"#, "candidate:"),
            (
                r#"{"candidate":"candidate:1 1 udp 1 1.2.3.4 99999 typ host","sdpMid":"0"}"#,
                "port",
            ),
            (
                r#"{"candidate":"candidate:1 1 sctp 1 1.2.3.4 9 typ host","sdpMid":"0"}"#,
                "transport",
            ),
            (
                r#"{"candidate":"candidate:1 1 udp 1 1.2.3.4 9 typ host","sdpMid":"nope"}"#,
                "sdpMid",
            ),
            (
                r#"{"candidate":"candidate:1 1 udp 1 1.2.3.4 9 typ host"}"#,
                "sdpMid",
            ),
            (
                r#"{"candidate":"candidate:1 1 udp 1 1.2.3.4 9 typ host","sdpMid":"0","usernameFragment":"zzzz"}"#,
                "ufrag",
            ),
        ];
        for (json, reason) in cases {
            let error = check_candidate(json, Some("abcd")).expect_err(reason);
            assert!(
                error.contains(reason),
                "{json}: {error:?} should say {reason:?}"
            );
        }
    }

    #[test]
    fn a_candidate_keeps_to_its_senders_last_description() {
        let mut gate = SignalRules::default();
        let peer = PeerId(uuid::Uuid::from_u128(7));
        let candidate = r#"{"candidate":"","sdpMid":"0","usernameFragment":"abcd"}"#;
        let signal = PeerSignal::IceCandidate(candidate.into());
        assert!(
            gate.check(peer, &signal).is_err(),
            "no description from the peer yet"
        );
        gate.check(peer, &PeerSignal::Offer(sdp(MEDIA, FINGERPRINT)))
            .unwrap();
        gate.check(peer, &signal).unwrap();
        gate.forget(peer);
        assert!(gate.check(peer, &signal).is_err());
    }
}
