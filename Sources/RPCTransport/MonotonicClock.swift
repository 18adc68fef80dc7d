#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The monotonic clock in nanoseconds, read as cheaply as it can be: one vDSO `clock_gettime`,
/// no `ContinuousClock.Instant` and no 128-bit `Duration` arithmetic. For what the transport
/// times on every call (an observed call's duration); never 0, which callers use for "unset".
enum MonotonicClock {
    @inline(__always)
    static func nanoseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec) | 1
    }
}
