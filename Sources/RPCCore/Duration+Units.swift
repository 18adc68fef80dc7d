extension Duration {
    /// Whole milliseconds (truncated; saturating past `Int64`): SQL timestamps, C timeouts, messages.
    public var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        let (ms, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = ms.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        return overflow2 ? (attoseconds < 0 ? .min : .max) : sum
    }
    /// Seconds as a floating-point number (rates, backoff).
    public var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
    /// Whole nanoseconds (truncated; saturating past `Int`): call durations counted in
    /// integers, waits given to C and Dispatch.
    public var wholeNanoseconds: Int {
        let (seconds, attoseconds) = components
        let (ns, overflow) = Int(seconds).multipliedReportingOverflow(by: 1_000_000_000)
        return overflow ? (seconds < 0 ? .min : .max) : ns &+ Int(attoseconds / 1_000_000_000)
    }
}
