//! The `Examples:` sections of a clap command tree, parsed back by the
//! same tree: an example that no longer parses, or that runs another
//! command than the one whose help shows it, is a help page that lies.

use clap::Command;

/// Checks every example of every `after_help` in `cli`'s tree (the lines
/// under `Examples:` up to the first blank line that run the binary) and
/// panics listing each one that `cli` refuses or that runs another
/// subcommand than the one whose help shows it. A shell's parts around
/// the call are left out: variables set before it, a pipe into it, and
/// from a redirect, a pipe, `&&` or a `#` comment on. Fails if the tree
/// shows no example at all, so it cannot pass on help that lost them.
pub fn check_examples(cli: Command) {
    let bin = cli.get_name().to_owned();
    let mut examples = Vec::new();
    collect(&cli, &mut Vec::new(), &bin, &mut examples);
    assert!(!examples.is_empty(), "{bin} --help shows no example");
    let mut wrong = Vec::new();
    for (shown_under, line, args) in &examples {
        match cli.clone().try_get_matches_from(args) {
            Err(e) => wrong.push(format!("{line:?} (in `{}`): {e}", shown_under.join(" "))),
            Ok(matches) => {
                let mut ran = vec![bin.clone()];
                let mut at = &matches;
                while let Some((name, sub)) = at.subcommand() {
                    ran.push(name.to_owned());
                    at = sub;
                }
                if !ran.starts_with(shown_under) {
                    wrong.push(format!(
                        "{line:?} runs `{}` but is shown under `{}`",
                        ran.join(" "),
                        shown_under.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "help examples that lie:\n{}",
        wrong.join("\n")
    );
}

/// Adds the examples of `command` (at `path` under the root) and of its
/// subcommands: the path, the line, the call's words from the binary on.
fn collect(
    command: &Command,
    path: &mut Vec<String>,
    bin: &str,
    out: &mut Vec<(Vec<String>, String, Vec<String>)>,
) {
    path.push(command.get_name().to_owned());
    if let Some(help) = command.get_after_help().map(ToString::to_string)
        && let Some((_, examples)) = help.split_once("Examples:\n")
    {
        for line in examples.lines().take_while(|l| !l.trim().is_empty()) {
            if let Some(args) = call(line, bin) {
                out.push((path.clone(), line.trim().to_owned(), args));
            }
        }
    }
    for sub in command.get_subcommands() {
        collect(sub, path, bin, out);
    }
    path.pop();
}

/// The words of `line`'s call of `bin`, if it has one.
fn call(line: &str, bin: &str) -> Option<Vec<String>> {
    let line = line.split(" #").next().unwrap_or_default();
    let words = shlex::split(line)?;
    let start = words.iter().position(|w| w == bin)?;
    Some(
        words[start..]
            .iter()
            .take_while(|w| !matches!(w.as_str(), "|" | ">" | ">>" | "<" | "&&" | "||" | ";"))
            .cloned()
            .collect(),
    )
}
