//! The Azure Pipelines agent: package cache, configure/run phases. (Being written.)
