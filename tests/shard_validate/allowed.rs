//! A constrained step's allowed tokens in `Message::check` and a donor's validator.

use super::*;

/// A constrained step's allowed tokens: a bitset of exactly the vocabulary's size, or runs
/// that ascend apart within it, never empty, and never with a Hidden reply; a donor's
/// validator refuses a wrong-size mask with its sizes.
#[test]
fn allowed_token_rejections() {
    let with = |allowed: AllowedTokens| {
        Message::Forward(Forward {
            allowed: Some(allowed),
            ..forward(0, 0, 2)
        })
    };
    let empty = FrameError::Empty {
        field: "allowed tokens",
    };
    let bad_run = |index, start, end| FrameError::BadRun { index, start, end };
    let cases = [
        (Bits(vec![0b1, 0]), mask_size(2)),
        (Bits(vec![]), empty.clone()),
        (Bits(vec![0]), empty.clone()),
        (
            Bits(vec![0b10_0001]),
            FrameError::IdOutOfRange {
                field: "allowed tokens",
                index: 5,
                id: 5,
                vocab_size: VOCAB,
            },
        ),
        (Runs(vec![]), empty),
        (Runs(vec![[2, 2]]), bad_run(0, 2, 2)),
        (Runs(vec![[0, 2], [2, 3]]), bad_run(1, 2, 3)),
        (Runs(vec![[3, 4], [0, 1]]), bad_run(1, 0, 1)),
        (Runs(vec![[1, VOCAB + 1]]), bad_run(0, 1, VOCAB + 1)),
        (
            Runs(vec![[0, 1], [2, 3], [4, 5], [6, 7]]),
            FrameError::TooManyRuns {
                found: 4,
                vocab_size: VOCAB,
            },
        ),
    ];
    for (allowed, expected) in cases {
        assert_rejects(with(allowed), expected);
    }
    assert_rejects(
        Message::Forward(Forward {
            reply: Reply::Hidden {
                encoding: Encoding::F16,
            },
            allowed: Some(Bits(vec![0b1])),
            ..forward(0, 0, 2)
        }),
        FrameError::Unexpected {
            kind: Kind::Forward,
            reason: "allowed tokens with a Hidden reply",
        },
    );
    for good in [
        Bits(vec![0b1_1111]),
        Bits(vec![0b100]),
        Runs(vec![[0, 1], [4, 5]]),
    ] {
        checked(&with(good.clone())).unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
    let wrong_size = Forward {
        allowed: Some(Bits(vec![0xff; 125])),
        ..forward(0, 0, 2)
    };
    let error = accept(&mut donor_validator(), wrong_size).unwrap_err();
    assert_eq!(error, mask_size(125));
    assert_eq!(
        error.to_string(),
        "allowed tokens: a bitset of 125 bytes, but the 5-token vocabulary needs 1"
    );
}

fn mask_size(found: usize) -> FrameError {
    FrameError::MaskSize {
        expected: 1,
        found,
        vocab_size: VOCAB,
    }
}
