//! Bearer tokens on the receiving side: the collector's ingest and read tokens, the daemon's
//! metrics token. One comparison, in the same time whatever the first wrong byte.

/// True when no token is required, or `authorization` (the header's value) is `Bearer <token>`.
pub fn matches(token: Option<&str>, authorization: Option<&[u8]>) -> bool {
    let Some(token) = token else { return true };
    let Some(given) = authorization.and_then(|a| a.strip_prefix(b"Bearer ")) else { return false };
    given.len() == token.len() && given.iter().zip(token.as_bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_after_bearer_matches() {
        assert!(matches(None, None));
        assert!(matches(Some("t0k"), Some(b"Bearer t0k")));
        for wrong in [
            None,
            Some(&b"t0k"[..]),
            Some(b"Bearer t0"),
            Some(b"Bearer t0kk"),
            Some(b"bearer t0k"),
            Some(b"Bearer T0k"),
        ] {
            assert!(!matches(Some("t0k"), wrong), "{wrong:?}");
        }
    }
}
