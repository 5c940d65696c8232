//! Token texts with a text → id index that stores only ids: the table hashes and compares the
//! texts in place, so building it for a 262k vocabulary allocates no per-token keys.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::TokenizerError;

#[derive(Debug)]
pub(crate) struct TokenIndex {
    texts: Vec<String>,
    table: HashTable<u32>,
}

fn hash(text: &str) -> u64 {
    FxBuildHasher.hash_one(text)
}

impl TokenIndex {
    /// Indexes `texts`; two tokens with the same text are an error, as in llama.cpp.
    pub(crate) fn new(texts: Vec<String>) -> Result<TokenIndex, TokenizerError> {
        let mut table = HashTable::with_capacity(texts.len());
        for (id, text) in texts.iter().enumerate() {
            let h = hash(text);
            if let Some(&first) = table.find(h, |&other: &u32| texts[other as usize] == *text) {
                return Err(TokenizerError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: id as u32,
                });
            }
            table.insert_unique(h, id as u32, |&other: &u32| hash(&texts[other as usize]));
        }
        Ok(TokenIndex { texts, table })
    }

    /// The id of the token with exactly this text.
    pub(crate) fn get(&self, text: &str) -> Option<u32> {
        self.table
            .find(hash(text), |&id| self.texts[id as usize] == text)
            .copied()
    }

    pub(crate) fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub(crate) fn texts(&self) -> &[String] {
        &self.texts
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_token_and_rejects_duplicates() {
        let texts: Vec<String> = (0..5000).map(|i| format!("t{i}")).collect();
        let index = TokenIndex::new(texts).expect("unique");
        for i in 0..5000u32 {
            assert_eq!(index.get(&format!("t{i}")), Some(i));
        }
        assert_eq!(index.get("t5000"), None);
        let dup = TokenIndex::new(vec!["a".into(), "b".into(), "a".into()]);
        assert!(matches!(
            dup,
            Err(TokenizerError::DuplicateToken {
                first: 0,
                second: 2,
                ..
            })
        ));
    }
}
