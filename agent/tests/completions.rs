//! Completions and man pages, as tools of the field ship them, made from the command line's own
//! definition: `gpuprof completions SHELL` prints a script that its shell parses and that names
//! every verb; `gpuprof man --dir DIR` writes gpuprof.1 and a page for every verb, which groff
//! renders. zsh, fish and groff are test prerequisites (scripts/install-prerequisites.sh): under
//! CI=true a missing one fails; elsewhere its check is left out, and said.

use std::process::{Command, Output};

use gpuprof_testkit::*;

/// The verbs, in the order --help lists them: completions and man last.
const VERBS: [&str; 12] = [
    "attach",
    "report",
    "top",
    "doctor",
    "export",
    "whatif",
    "summary",
    "daemon",
    "inject",
    "run",
    "completions",
    "man",
];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn gpuprof_with(args: &[&str]) -> Output {
    let output = Command::new(gpuprof()).args(args).output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "gpuprof {}: {}", args.join(" "), text(&output.stderr));
    output
}

/// The verbs `gpuprof --help` lists under "Commands:", but `help`.
fn verbs_in_help() -> Vec<String> {
    let help = text(&gpuprof_with(&["--help"]).stdout);
    let (_, commands) = help.split_once("Commands:\n").unwrap_or_else(|| panic!("{help}"));
    commands
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("    "))
        .map(|line| line.split_whitespace().next().unwrap().to_string())
        .filter(|verb| verb != "help")
        .collect()
}

/// Where `tool` is on PATH; None, said, when it is missing outside CI (under CI=true it fails).
fn prerequisite(tool: &str, checks: &str) -> Option<String> {
    let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output_within(PATIENCE);
    if found.status.success() {
        return Some(text(&found.stdout).trim().to_string());
    }
    let how = format!("{tool} is not installed, so {checks} is not checked: run scripts/install-prerequisites.sh");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI requires it: {how}");
    eprintln!("gpuprof test: {how}");
    None
}

/// The words of a script: what a verb is, wherever the shell's syntax puts it.
fn words(script: &str) -> std::collections::HashSet<&str> {
    script.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).collect()
}

#[test]
fn help_lists_every_verb_with_completions_and_man_last() {
    assert_eq!(verbs_in_help(), VERBS);
}

#[test]
fn every_shell_gets_a_script_it_parses_naming_every_verb() {
    let dir = scratch("completions");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = text(&gpuprof_with(&["completions", shell]).stdout);
        let words = words(&script);
        for verb in VERBS {
            assert!(words.contains(verb), "{shell}: no {verb} in\n{script}");
        }
        let file = dir.join(format!("gpuprof.{shell}"));
        std::fs::write(&file, &script).unwrap();
        let parse: &[&str] = match shell {
            "bash" => &["bash", "-n"],
            "zsh" => &["zsh", "-n"],
            "fish" => &["fish", "--no-execute"],
            // No elvish or PowerShell on the machines that test gpuprof: their scripts are held
            // to naming every verb, above.
            _ => continue,
        };
        let Some(parser) = prerequisite(parse[0], &format!("the {shell} script's syntax")) else { continue };
        let parsed = Command::new(parser).args(&parse[1..]).arg(&file).output_within(PATIENCE);
        assert_eq!(
            (parsed.status.code(), text(&parsed.stderr)),
            (Some(0), String::new()),
            "{} {}",
            parse.join(" "),
            file.display()
        );
    }
    // bash completes the verbs from the script, as a person's Tab would.
    let completed = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(gpuprof su); COMP_CWORD=1; COMP_LINE='gpuprof su'; COMP_POINT=10; _gpuprof gpuprof su gpuprof; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            dir.join("gpuprof.bash").display()
        ))
        .output_within(PATIENCE);
    assert_eq!(text(&completed.stdout), "summary\n", "{}", text(&completed.stderr));
}

#[test]
fn man_writes_a_page_for_gpuprof_and_every_verb() {
    let dir = scratch("man");
    let pages = dir.join("man1");
    let wrote = gpuprof_with(&["man", "--dir", pages.to_str().unwrap()]);
    let mut expected: Vec<String> = VERBS.iter().map(|verb| format!("gpuprof-{verb}.1")).collect();
    expected.push("gpuprof.1".to_string());
    expected.sort();
    let mut written: Vec<String> =
        std::fs::read_dir(&pages).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    written.sort();
    assert_eq!(written, expected);
    assert_eq!(
        text(&wrote.stderr),
        format!(
            "gpuprof: wrote 13 man pages to {} (gpuprof.1 and gpuprof-VERB.1); read one with `man -l {}`, or install them under share/man/man1\n",
            pages.display(),
            pages.join("gpuprof.1").display()
        )
    );
    let version = env!("CARGO_PKG_VERSION");
    for page in &written {
        let name = page.trim_end_matches(".1");
        let roff = std::fs::read_to_string(pages.join(page)).unwrap();
        let title = roff.lines().find(|line| line.starts_with(".TH ")).unwrap_or_else(|| panic!("{page}:\n{roff}"));
        assert_eq!(title, format!(".TH {name} 1  \"gpuprof {version}\" \"gpuprof manual\""), "{page}");
        let Some(groff) = prerequisite("groff", "how the man pages render") else { continue };
        // -k: the pages are UTF-8 (help says "…" and "↑/↓"), read as man reads them (preconv).
        let rendered =
            Command::new(groff).args(["-k", "-man", "-Tutf8", "-ww"]).arg(pages.join(page)).output_within(PATIENCE);
        let shown = text(&rendered.stdout);
        assert_eq!((rendered.status.code(), text(&rendered.stderr)), (Some(0), String::new()), "{page}");
        // groff draws names in bold by overstriking: the plain text, for reading.
        let plain = plain(&shown);
        assert!(plain.contains("NAME") && plain.contains("SYNOPSIS") && plain.contains(name), "{page}:\n{plain}");
    }
    // The top page names every verb's page.
    let top = std::fs::read_to_string(pages.join("gpuprof.1")).unwrap();
    for verb in VERBS {
        assert!(top.contains(&format!("\n.TP\ngpuprof\\-{verb}(1)\n")), "{verb}:\n{top}");
    }
    // Without --dir, gpuprof.1 on stdout, the same page.
    let stdout = gpuprof_with(&["man"]);
    assert_eq!(text(&stdout.stdout), std::fs::read_to_string(pages.join("gpuprof.1")).unwrap());
    assert_eq!(text(&stdout.stderr), "");
}

/// Text as groff's terminal output reads without its overstriking (`X\bX` bold, `_\bX` underline)
/// and escape sequences.
fn plain(shown: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    let mut chars = shown.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{8}' => {
                out.pop();
            }
            '\x1b' => {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            c => out.push(c),
        }
    }
    out.into_iter().collect()
}
