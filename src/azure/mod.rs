//! Azure DevOps REST client. (Being written.)
