import Foundation
import RPCCore

/// `GET /status` (HTML for a person, on a phone or a desktop) and `GET /status.json` (the same
/// for tools), from a `StatusReport`. Everything that came from a scrape (code names,
/// destinations) is escaped; nothing on them is secret: no addresses of clients or upstreams, no
/// tokens, no user ids (docs/observability.md, "Status page").
enum StatusPage {
    static let path = "/status"
    static let jsonPath = "/status.json"
    /// The page reloads itself this often (seconds).
    static let refreshSeconds = 10

    static func serves(_ path: Substring) -> Bool { path == Self.path || path == jsonPath }

    static func respond(_ request: HTTPRequest, board: StatusBoard) -> HTTPResponse {
        guard request.method == "GET" || request.method == "HEAD" else {
            return HTTPResponse(
                status: 405, headers: [("allow", "GET, HEAD"), ("content-type", "text/plain; charset=utf-8")],
                body: Array("\(request.path) answers GET and HEAD only\n".utf8))
        }
        let report = board.report()
        if request.path == jsonPath {
            return HTTPResponse(
                status: 200, headers: [("content-type", "application/json"), ("cache-control", "no-store"), ("x-content-type-options", "nosniff")],
                body: json(report))
        }
        // HEAD gets GET's body too: the transport sends its length and not the bytes (RFC 9110 §9.3.2).
        return HTMLPage.response(200, title: "Backend status", body: html(report), head: refreshMeta, wide: true)
    }

    static let refreshMeta = "<meta http-equiv=\"refresh\" content=\"\(refreshSeconds)\">"

    // MARK: HTML

    static func html(_ r: StatusReport) -> String {
        let e = HTMLPage.escape
        var b = "<h1>Backend status</h1>"
        if r.requiredDown.isEmpty {
            b += "<p id=\"overall\"><span class=\"status ok\">Serving</span> Every required service answers its health check.</p>"
        } else {
            let names = r.requiredDown.map { "<a href=\"#svc-\(e($0))\"><strong>\(e($0))</strong></a>" }.joined(separator: ", ")
            b += "<p id=\"overall\"><span class=\"status bad\">Not serving</span> Down: \(names).</p>"
        }
        var about = "Updated \(clock(r.generatedAt))"
        if let interval = r.interval {
            about += " · metrics scraped every \(duration(interval / .seconds(1)))"
        } else {
            about += " · metrics scraping is off"
        }
        about += " · this page reloads every \(refreshSeconds) s · <a href=\"\(jsonPath)\">JSON</a>"
        b += "<p class=\"muted\">\(about)</p>"
        b += "<div class=\"grid\">"
        for p in r.processes { b += card(p, now: r.generatedAt) }
        b += "</div>"
        b += "<p class=\"muted\">Errors: every call that did not end OK or CANCELLED; server errors: UNKNOWN, INTERNAL, UNAVAILABLE, "
        b += "DATA_LOSS, DEADLINE_EXCEEDED. Rates over the time between the last two scrapes; health checks not counted.</p>"
        return b
    }

    static func badge(_ p: ProcessStatus) -> (text: String, ok: Bool) {
        if p.isGateway { return p.serving ? ("serving", true) : ("not serving", false) }
        if p.serving { return ("up", true) }
        return p.metrics == .ok ? ("not serving", false) : ("down", false)
    }

    static func card(_ p: ProcessStatus, now: Date) -> String {
        let e = HTMLPage.escape
        let (text, ok) = badge(p)
        let rates = p.rates
        var attributes =
            "id=\"svc-\(e(p.name))\" data-service=\"\(e(p.name))\" data-health=\"\(e(text))\" data-metrics=\"\(metricsState(p.metrics))\""
        attributes += " data-rps=\"\(rates.map { number($0.requestsPerSecond) } ?? "")\""
        attributes += " data-error-ratio=\"\(rates?.errorRatio.map(number) ?? "")\""
        attributes += " data-server-error-ratio=\"\(rates?.serverErrorRatio.map(number) ?? "")\""
        var c = "<section class=\"card svc\" \(attributes)>"
        c += "<h2><span>\(e(p.name))"
        if !p.isGateway && !p.required { c += " <span class=\"muted\">(optional)</span>" }
        c += "</span><span class=\"status \(ok ? "ok" : "bad")\">\(text)</span></h2>"
        c += "<dl>"
        c += "<dt>Requests</dt><dd class=\"rps\">\(rates.map { rate($0.requestsPerSecond) } ?? dash)</dd>"
        if let rates, let ratio = rates.errorRatio {
            let server = rates.serverErrorRatio ?? 0
            // Clients' errors in amber, the service's own in red.
            c += "<dt>Errors</dt><dd class=\"errors\"><span class=\"nw\"><span class=\"\(ratio > 0 ? "warn" : "")\">\(percent(ratio))</span>"
            c += " <span class=\"muted\">(\(rate(rates.errorsPerSecond)))</span></span>"
            c += " · <span class=\"nw\">server <span class=\"\(server > 0 ? "err" : "")\">\(percent(server))</span></span></dd>"
        } else {
            c += "<dt>Errors</dt><dd class=\"errors\">\(dash)</dd>"
        }
        if let rates, let mean = rates.meanLatency {
            c += "<dt>Latency</dt><dd><span class=\"nw\">\(duration(mean)) mean</span>"
            if let p95 = rates.p95Latency { c += " · <span class=\"nw\">\(duration(p95)) p95</span>" }
            c += "</dd>"
        } else {
            c += "<dt>Latency</dt><dd>\(dash)</dd>"
        }
        var busy = p.callsInFlight.map { "<span class=\"nw\">\(count($0)) call\($0 == 1 ? "" : "s")</span>" } ?? dash
        if let connections = p.connections {
            busy += " · <span class=\"nw\">\(count(connections)) connection\(connections == 1 ? "" : "s")</span>"
        }
        c += "<dt>In flight</dt><dd>\(busy)</dd>"
        c += "<dt>Outbox</dt><dd class=\"outbox\">\(outboxSummary(p.outbox))</dd>"
        c += "<dt>Metrics</dt><dd>\(metricsLine(p, now: now))</dd>"
        c += "</dl>"
        if let codes = rates?.codes, !codes.isEmpty {
            let list = codes.prefix(6).map { "\(e($0.code)) \(rate($0.perSecond))" }.joined(separator: ", ")
            c += "<p class=\"muted codes\">Not OK: \(list)</p>"
        }
        if let rows = p.outbox, !rows.isEmpty { c += outboxTable(rows) }
        c += "</section>"
        return c
    }

    static func metricsState(_ m: ProcessStatus.Metrics) -> String {
        switch m {
        case .pending: "pending"
        case .ok: "ok"
        case .failing: "failing"
        case .off: "off"
        }
    }

    static func metricsLine(_ p: ProcessStatus, now: Date) -> String {
        let last = p.lastScrape.map { "\(clock($0)), \(ago($0, now: now))" }
        switch p.metrics {
        case .pending: return "not scraped yet"
        case .ok: return (last ?? "") + (p.rates == nil ? " (rates after the next scrape)" : "")
        case .off(let why): return HTMLPage.escape(why)
        case .failing(let why):
            let since = last.map { "; last good \($0)" } ?? "; never scraped"
            return "<span class=\"err\">\(HTMLPage.escape(why))</span>\(since)"
        }
    }

    /// Known outbox gauges, in order, with their column names; any other `outbox_*` gauge follows
    /// under its own name.
    static let outboxColumns: [(metric: String, title: String)] = [
        ("backlog_events", "Waiting"), ("parked_events", "Parked"), ("oldest_event_age_seconds", "Oldest"),
    ]

    static func outboxSummary(_ rows: [ProcessTotals.OutboxRow]?) -> String {
        guard let rows else { return dash }
        var parts: [String] = []
        let waiting = rows.compactMap { $0.values["backlog_events"] }
        if !waiting.isEmpty { parts.append("\(count(waiting.reduce(0, +))) waiting") }
        let parked = rows.compactMap { $0.values["parked_events"] }
        if !parked.isEmpty { parts.append("\(count(parked.reduce(0, +))) parked") }
        if let oldest = rows.compactMap({ $0.values["oldest_event_age_seconds"] }).max(), oldest > 0 {
            parts.append("oldest \(age(oldest))")
        }
        if parts.isEmpty { parts.append("\(rows.count) destination\(rows.count == 1 ? "" : "s")") }
        return parts.joined(separator: " · ")
    }

    static func outboxTable(_ rows: [ProcessTotals.OutboxRow]) -> String {
        let e = HTMLPage.escape
        let present = Set(rows.flatMap(\.values.keys))
        var columns = outboxColumns.filter { present.contains($0.metric) }
        let known = Set(outboxColumns.map(\.metric))
        columns += present.subtracting(known).sorted().map { ($0, $0.replacingOccurrences(of: "_", with: " ")) }
        var t = "<table class=\"outbox\"><thead><tr><th>Outbox to</th>"
        for c in columns { t += "<th class=\"n\">\(e(c.title))</th>" }
        t += "</tr></thead><tbody>"
        for row in rows {
            t += "<tr><td>\(row.destination.isEmpty ? dash : e(row.destination))</td>"
            for c in columns {
                let v = row.values[c.metric]
                let text = v.map { c.metric.hasSuffix("_seconds") ? age($0) : count($0) } ?? dash
                t += "<td class=\"n\">\(text)</td>"
            }
            t += "</tr>"
        }
        return t + "</tbody></table>"
    }

    // MARK: JSON

    static func json(_ r: StatusReport) -> [UInt8] {
        var processes: [JSONValue] = []
        for p in r.processes {
            var m: [(String, JSONValue)] = [
                ("name", .string(p.name)), ("gateway", .bool(p.isGateway)), ("required", .bool(p.required)),
                ("serving", .bool(p.serving)), ("health", .string(badge(p).text)), ("metrics", .string(metricsState(p.metrics))),
            ]
            switch p.metrics {
            case .failing(let why), .off(let why): m.append(("metricsProblem", .string(why)))
            case .pending, .ok: break
            }
            m.append(("lastScrape", p.lastScrape.map { .string(iso($0)) } ?? .null))
            m.append(("lastScrapeAgeSeconds", p.lastScrape.map { num(r.generatedAt.timeIntervalSince($0)) } ?? .null))
            let rates = p.rates
            m.append(("windowSeconds", rates.map { num($0.seconds) } ?? .null))
            m.append(("requestsPerSecond", rates.map { num($0.requestsPerSecond) } ?? .null))
            m.append(("errorsPerSecond", rates.map { num($0.errorsPerSecond) } ?? .null))
            m.append(("errorRatio", rates?.errorRatio.map(num) ?? .null))
            m.append(("serverErrorsPerSecond", rates.map { num($0.serverErrorsPerSecond) } ?? .null))
            m.append(("serverErrorRatio", rates?.serverErrorRatio.map(num) ?? .null))
            m.append(("codesPerSecond", rates.map { .object($0.codes.map { ($0.code, num($0.perSecond)) }) } ?? .null))
            m.append(("meanLatencySeconds", rates?.meanLatency.map(num) ?? .null))
            m.append(("p95LatencySeconds", rates?.p95Latency.map(num) ?? .null))
            m.append(("callsInFlight", p.callsInFlight.map(num) ?? .null))
            m.append(("connections", p.connections.map(num) ?? .null))
            m.append(
                (
                    "outbox",
                    p.outbox.map { rows in
                        .array(
                            rows.map { row in
                                .object(
                                    [("destination", .string(row.destination))]
                                        + row.values.sorted { $0.key < $1.key }.map { ($0.key, num($0.value)) })
                            })
                    } ?? .null
                ))
            processes.append(.object(m))
        }
        let root: JSONValue = .object([
            ("generatedAt", .string(iso(r.generatedAt))),
            ("serving", .bool(r.requiredDown.isEmpty)),
            ("requiredDown", .array(r.requiredDown.map { .string($0) })),
            ("scrapeIntervalSeconds", r.interval.map { num($0 / .seconds(1)) } ?? .null),
            ("processes", .array(processes)),
        ])
        return JSONWriter.serialize(root) + [UInt8(ascii: "\n")]
    }

    static func num(_ x: Double) -> JSONValue { x.isFinite ? .number("\(x)") : .null }

    // MARK: Formatting

    static let dash = "—"

    /// A plain decimal for attributes (tests and scripts read them).
    static func number(_ x: Double) -> String { x.isFinite ? String(format: "%.4f", x) : "" }

    static func rate(_ x: Double) -> String {
        if x == 0 { return "0/s" }
        if x < 0.1 { return String(format: "%.2f/s", x) }
        if x < 100 { return String(format: "%.1f/s", x) }
        return String(format: "%.0f/s", x)
    }

    static func percent(_ ratio: Double) -> String {
        let p = ratio * 100
        if p == 0 { return "0%" }
        if p < 0.1 { return "<0.1%" }
        if p < 10 { return String(format: "%.1f%%", p) }
        return String(format: "%.0f%%", p)
    }

    static func count(_ x: Double) -> String { x.isFinite ? String(format: "%.0f", x) : dash }

    /// Seconds as µs, ms or s.
    static func duration(_ s: Double) -> String {
        guard s.isFinite else { return dash }
        if s < 0.001 { return String(format: "%.0f µs", s * 1_000_000) }
        if s < 0.01 { return String(format: "%.1f ms", s * 1000) }
        if s < 1 { return String(format: "%.0f ms", s * 1000) }
        if s < 60 && s != s.rounded() { return String(format: "%.2f s", s) }
        if s < 60 { return String(format: "%.0f s", s) }
        return age(s)
    }

    /// An age in seconds, minutes, hours or days.
    static func age(_ s: Double) -> String {
        guard s.isFinite else { return dash }
        if s < 60 { return String(format: "%.0f s", s) }
        if s < 3600 { return String(format: "%.0f min", s / 60) }
        if s < 86400 { return String(format: "%.1f h", s / 3600) }
        return String(format: "%.1f d", s / 86400)
    }

    static func ago(_ date: Date, now: Date) -> String { "\(age(max(0, now.timeIntervalSince(date)))) ago" }

    /// `HH:MM:SS UTC`.
    static func clock(_ date: Date) -> String {
        let c = civil(date)
        return "\(pad(c.hour)):\(pad(c.minute)):\(pad(c.second)) UTC"
    }

    /// `YYYY-MM-DDTHH:MM:SSZ`.
    static func iso(_ date: Date) -> String {
        let c = civil(date)
        return "\(c.year)-\(pad(c.month))-\(pad(c.day))T\(pad(c.hour)):\(pad(c.minute)):\(pad(c.second))Z"
    }

    static func pad(_ n: Int) -> String { n < 10 ? "0\(n)" : "\(n)" }

    /// The UTC calendar fields of a date (days from civil, H. Hinnant's algorithm, inverted).
    static func civil(_ date: Date) -> (year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int) {
        let t = Int(date.timeIntervalSince1970.rounded(.down))
        let days = t >= 0 ? t / 86400 : (t - 86399) / 86400
        let secs = t - days * 86400
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let day = doy - (153 * mp + 2) / 5 + 1
        let month = mp < 10 ? mp + 3 : mp - 9
        let year = yoe + era * 400 + (month <= 2 ? 1 : 0)
        return (year, month, day, secs / 3600, secs % 3600 / 60, secs % 60)
    }
}
