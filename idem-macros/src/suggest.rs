//! "Did you mean" for misspelled option names.

/// The candidate closest to `word` by edit distance, if it is close enough to be a typo.
pub(crate) fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (distance(word, c), *c))
        .filter(|&(d, c)| d <= (c.len() / 3).max(2))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance between two short ASCII-ish words.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: &[&str] = &["key", "version", "entity", "scope", "crate"];

    #[test]
    fn typos_find_their_option() {
        assert_eq!(closest("versoin", OPTIONS), Some("version"));
        assert_eq!(closest("kye", OPTIONS), Some("key"));
        assert_eq!(closest("entiy", OPTIONS), Some("entity"));
        assert_eq!(closest("scop", OPTIONS), Some("scope"));
    }

    #[test]
    fn unrelated_words_find_nothing() {
        assert_eq!(closest("retries", OPTIONS), None);
        assert_eq!(closest("x", OPTIONS), None);
    }
}
