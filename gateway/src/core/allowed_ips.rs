//! Allowed-IPs longest-prefix-match table. (Skeleton.)
