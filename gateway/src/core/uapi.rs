//! The cross-platform userspace API (wireguard-go's UAPI). (Skeleton.)
