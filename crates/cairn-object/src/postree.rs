//! POS-tree (being written).
