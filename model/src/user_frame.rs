//! The user's own line in a stack: the innermost frame that is neither the standard library nor
//! an installed package (site-packages, dist-packages) nor generated code (`<frozen …>`,
//! `<string>`). PyTorch's `Linear.forward` is where memory is asked for; the line of the
//! training script that called it is what a person changes.

use crate::event::Frame;

pub fn user_frame(stack: &[Frame]) -> Option<&Frame> {
    stack.iter().find(|frame| !is_library(&frame.file))
}

fn is_library(file: &str) -> bool {
    file.starts_with('<')
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || is_standard_library(file)
}

/// `…/lib/python3.12/…` or `…/lib64/python3.12/…` (a virtualenv's too), and Debian's
/// `/usr/lib/python3/…` outside dist-packages.
fn is_standard_library(file: &str) -> bool {
    ["/lib/python", "/lib64/python"].iter().any(|marker| {
        file.match_indices(marker).any(|(at, _)| file[at + marker.len()..].starts_with(|c: char| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, function: &str) -> Frame {
        Frame { function: function.into(), file: file.into(), line: 1 }
    }

    #[test]
    fn the_first_frame_outside_libraries_is_the_users() {
        let stack = [
            frame("/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", "Linear.forward"),
            frame("/usr/lib/python3.12/contextlib.py", "inner"),
            frame("<frozen runpy>", "_run_code"),
            frame("/home/me/train.py", "step"),
            frame("/home/me/train.py", "<module>"),
        ];
        assert_eq!(user_frame(&stack).map(|f| f.function.as_str()), Some("step"));
        assert_eq!(user_frame(&stack[..3]), None);
        assert!(is_library("/usr/lib/python3/dist-packages/numpy/core.py"));
        assert!(is_library("/root/.pyenv/versions/3.11.7/lib/python3.11/multiprocessing/process.py"));
        assert!(!is_library("/srv/python/lib/pythonic/train.py"));
        assert!(!is_library("/work/tests/fixtures/workloads/cuda_driver.py"));
    }
}
