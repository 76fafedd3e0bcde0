//! Manifests read as Kubernetes reads them: YAML 1.1, where a plain `0644` is octal (420) and a
//! plain `yes`/`on`/`off` is a boolean. yaml-rust2 reads YAML 1.2, where `0644` is 644 and `yes`
//! a string; written back as such, a volume's `defaultMode: 0644` would become 644, which the API
//! server refuses. Plain scalars of those forms are resolved the 1.1 way before loading, and are
//! written back in a form both versions read alike (420, true).

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, ScanError, TScalarStyle};
use yaml_rust2::{Yaml, YamlLoader};

pub(crate) fn load(text: &str) -> Result<Vec<Yaml>, ScanError> {
    let mut receiver = Yaml11 { loader: YamlLoader::default() };
    Parser::new_from_str(text).load(&mut receiver, true)?;
    Ok(receiver.loader.documents().to_vec())
}

struct Yaml11 {
    loader: YamlLoader,
}

impl MarkedEventReceiver for Yaml11 {
    fn on_event(&mut self, event: Event, mark: Marker) {
        let event = match event {
            Event::Scalar(value, TScalarStyle::Plain, anchor, None) => {
                Event::Scalar(resolve(value), TScalarStyle::Plain, anchor, None)
            }
            other => other,
        };
        self.loader.on_event(event, mark);
    }
}

/// A plain scalar's YAML 1.1 meaning, in YAML 1.2 words.
fn resolve(value: String) -> String {
    let digits =
        value.strip_prefix('0').filter(|rest| !rest.is_empty() && rest.bytes().all(|b| (b'0'..=b'7').contains(&b)));
    if let Some(octal) = digits.and_then(|d| i64::from_str_radix(d, 8).ok()) {
        return octal.to_string();
    }
    match value.as_str() {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => "true".to_string(),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => "false".to_string(),
        _ => value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_modes_and_yaml_11_booleans_keep_their_meaning() {
        let docs = load("defaultMode: 0644\nmode: 0755\nzero: 0\nplain: 644\nquoted: \"0644\"\nstdin: yes\ntty: off\nname: on-call\nnine: 0698\n").unwrap();
        let doc = &docs[0];
        assert_eq!(doc["defaultMode"], Yaml::Integer(420));
        assert_eq!(doc["mode"], Yaml::Integer(493));
        assert_eq!(doc["zero"], Yaml::Integer(0));
        assert_eq!(doc["plain"], Yaml::Integer(644));
        assert_eq!(doc["quoted"], Yaml::String("0644".into()));
        assert_eq!(doc["stdin"], Yaml::Boolean(true));
        assert_eq!(doc["tty"], Yaml::Boolean(false));
        assert_eq!(doc["name"], Yaml::String("on-call".into()));
        // Not octal: a number either way.
        assert_eq!(doc["nine"], Yaml::Integer(698));
    }
}
