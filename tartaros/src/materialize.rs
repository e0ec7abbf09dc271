//! `--materialize`: absent denied paths are created as empty directories
//! for the run (one placeholder kind serves files like `.env` and
//! directories like `.git/hooks`: nothing can be created at or under it),
//! and removed after the run if still empty, so the tree is handed back as
//! it was. Which paths to create is decided in `decide.rs`.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    #[error("failed to materialize {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Creates `dirs` in order (outermost first). On failure, removes what it
/// created and says which one failed.
pub fn create(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, MaterializeError> {
    let mut created = Vec::new();
    for dir in dirs {
        if let Err(source) = std::fs::create_dir(dir) {
            cleanup_placeholders(&created);
            return Err(MaterializeError::Create {
                path: dir.clone(),
                source,
            });
        }
        created.push(dir.clone());
    }
    Ok(created)
}

/// Removes the placeholders that are still empty, innermost first.
pub fn cleanup_placeholders(created: &[PathBuf]) {
    for dir in created.iter().rev() {
        let _ = std::fs::remove_dir(Path::new(dir));
    }
}
