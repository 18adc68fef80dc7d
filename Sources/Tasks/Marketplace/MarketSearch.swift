import Foundation
import RPCCore
import ServiceKit
import Storage

/// SearchMarketTasks as SQL over what SQLite already has: the FTS5 trigram index of the folded
/// title and description (`TextFold`) finds the tasks containing every keyword of three or more
/// characters (shorter ones, which trigrams cannot index, are checked with `instr` on the same
/// folded columns of those rows: one rule for both), the R*Tree narrows a distance search to the bounding box of the circle (split at
/// the antimeridian, every longitude around a pole), and the exact great-circle distance is
/// computed for those candidates only. Results: by distance, ties newest first (ids are ULIDs in
/// creation order), or newest first without a point.
///
/// The full scan (`useIndexes: false`, `TASKS_SEARCH_INDEXES=0`) answers the same query by reading
/// every open task: the reference of the tests and of the bench.
enum MarketSearch {
    struct Query: Sendable {
        /// Folded (`TextFold.fold`): matched as they are against the folded title and description.
        var words: [String]
        var statuses: [Int64]
        var near: GeoPoint?
        var radiusKm: Double?

        /// What a page token is bound to.
        var fingerprint: String {
            let place = near.map { "\($0.latitude.bitPattern):\($0.longitude.bitPattern)" } ?? "-"
            return "\(words.joined(separator: "\u{1}")):\(statuses):\(place):\(radiusKm?.bitPattern ?? 0)"
        }
    }

    struct Hit: Sendable {
        var id: String
        var distance: Double?
        /// [distance bits or "", id]
        var cursor: [String]
    }

    static func literal(_ d: Double) -> String { String(format: "%.17g", d) }

    /// Above this many places in the bounding box, the words narrow the candidates first (FTS5);
    /// below it, the candidates of the R*Tree are few and checked word by word.
    static let boxCandidatesForWordIndex = 20_000

    /// Up to this many places in the circle's bounding box, their rows are read and their words
    /// checked here (`TextFold.contains` on the folded columns); above it, SQLite orders the candidates
    /// and returns one page only (`LIMIT`), the words checked in SQL — the cost of a page never
    /// grows with the rows a huge circle (up to the contract's 20,000 km: the whole Earth) holds.
    static let boxCandidatesReadHere = 5_000

    /// How a search with a circle is answered.
    enum CirclePlan: Equatable {
        /// Few candidates: read, checked word by word and sorted here.
        case candidatesReadHere
        /// Many: ordered by (distance, newest) in SQL, one page read (`LIMIT`); the words of three
        /// or more characters narrow them through FTS5 first when the box holds more than
        /// `boxCandidatesForWordIndex`.
        case nearestInSQL(narrowedByWords: Bool)
    }

    static func run(_ c: Connection, _ q: Query, after cursor: [String]?, limit: Int, useIndexes: Bool) throws -> ([Hit], Bool) {
        if useIndexes, let near = q.near, let r = q.radiusKm { return try runInCircle(c, q, near: near, radius: r, after: cursor, limit: limit) }
        return try runSQL(c, q, after: cursor, limit: limit, useIndexes: useIndexes)
    }

    /// The plan of a search within `radius` of `near`: from the number of places in the circle's
    /// bounding box (an R*Tree count).
    static func circlePlan(_ c: Connection, _ q: Query, near: GeoPoint, radius: Double) throws -> CirclePlan {
        let box = Geo.rtreeCondition(Geo.boundingBox(center: near, radiusKm: radius), alias: "g")
        // Counted only as far as the two thresholds need: the count must not grow with the map.
        let bound = max(boxCandidatesReadHere, boxCandidatesForWordIndex) + 1
        let inBox =
            try c.queryOne(
                "SELECT COUNT(*) FROM (SELECT 1 FROM market_task_geo g WHERE \(box.sql) LIMIT \(bound))", arguments: box.args
            )?.get(0, as: Int64.self) ?? 0
        guard inBox > Int64(boxCandidatesReadHere) else { return .candidatesReadHere }
        return .nearestInSQL(narrowedByWords: MarketRules.ftsQuery(q.words) != nil && inBox > Int64(boxCandidatesForWordIndex))
    }

    /// Words and a circle: the R*Tree's candidates (the circle's bounding box, a CROSS JOIN so that
    /// SQLite starts from it), their exact distance in SQL, every word checked on those rows
    /// (a substring of the folded title or description, as the trigram index matches). A box holding very many places
    /// (a large radius in a dense area) is first narrowed by the FTS5 index.
    static func runInCircle(
        _ c: Connection, _ q: Query, near: GeoPoint, radius: Double, after cursor: [String]?, limit: Int
    ) throws -> (
        [Hit], Bool
    ) {
        let box = Geo.rtreeCondition(Geo.boundingBox(center: near, radiusKm: radius), alias: "g")
        let distance = Geo.sqlDistance(lat: "t.latitude", lon: "t.longitude", latParam: literal(near.latitude), lonParam: literal(near.longitude))
        let plan = try circlePlan(c, q, near: near, radius: radius)
        if case .nearestInSQL(let narrowed) = plan {
            return try nearestInSQL(c, q, box: box, distance: distance, radius: radius, narrowedByWords: narrowed, after: cursor, limit: limit)
        }
        let sql = """
            SELECT id, title_folded, description_folded, dist FROM (
                SELECT t.id AS id, t.title_folded AS title_folded, t.description_folded AS description_folded, \(distance) AS dist
                FROM market_task_geo g CROSS JOIN market_tasks t ON t.n = g.id
                WHERE \(box.sql) AND t.status IN (\(q.statuses.map { _ in "?" }.joined(separator: ",")))
            ) WHERE dist <= ?
            """
        let args = box.args + q.statuses.map { DatabaseValue.integer($0) } + [.real(radius)]
        var hits: [Hit] = []
        for row in try c.query(sql, arguments: args) {
            let title = try row.get("title_folded", as: String.self), description = try row.get("description_folded", as: String.self)
            guard q.words.allSatisfy({ TextFold.contains(title, $0) || TextFold.contains(description, $0) }) else { continue }
            let id: String = try row.get("id"), d: Double = try row.get("dist")
            hits.append(Hit(id: id, distance: d, cursor: [String(d.bitPattern), id]))
        }
        hits.sort { ($0.distance!, $1.id) < ($1.distance!, $0.id) }
        if let cursor, let bits = UInt64(cursor[0]) {
            let d = Double(bitPattern: bits), id = cursor[1]
            hits.removeAll { h in h.distance! < d || (h.distance! == d && h.id >= id) }
        }
        return (Array(hits.prefix(limit)), hits.count > limit)
    }

    /// A circle holding many places: the candidates of the bounding box, the words checked in SQL
    /// (FTS5 for those of three or more characters, `instr` for shorter ones, as without a circle),
    /// ordered by (distance, newest) after the page token, one page (`LIMIT`) read: SQLite keeps
    /// only the page's rows while it sorts.
    static func nearestInSQL(
        _ c: Connection, _ q: Query, box: (sql: String, args: [DatabaseValue]), distance: String, radius: Double, narrowedByWords: Bool,
        after cursor: [String]?, limit: Int
    ) throws -> ([Hit], Bool) {
        var conditions = [box.sql, "t.status IN (\(q.statuses.map { _ in "?" }.joined(separator: ",")))"]
        var args = box.args + q.statuses.map { DatabaseValue.integer($0) }
        var shortWords = q.words
        if let fts = MarketRules.ftsQuery(q.words) {
            shortWords = q.words.filter { $0.unicodeScalars.count < 3 }
            if narrowedByWords {
                conditions.append("t.n IN (SELECT rowid FROM market_task_text WHERE market_task_text MATCH ?)")
            } else {
                conditions.append("EXISTS (SELECT 1 FROM market_task_text WHERE market_task_text MATCH ? AND rowid = t.n)")
            }
            args.append(.text(fts))
        }
        for w in shortWords {
            conditions.append("(instr(t.title_folded, ?) > 0 OR instr(t.description_folded, ?) > 0)")
            args += [.text(w), .text(w)]
        }
        var sql = """
            SELECT id, dist FROM (
                SELECT t.id AS id, \(distance) AS dist FROM market_task_geo g CROSS JOIN market_tasks t ON t.n = g.id
                WHERE \(conditions.joined(separator: " AND "))
            ) WHERE dist <= ?
            """
        args.append(.real(radius))
        if let cursor, let bits = UInt64(cursor[0]) {
            let d = Double(bitPattern: bits)
            sql += " AND (dist > ? OR (dist = ? AND id < ?))"
            args += [.real(d), .real(d), .text(cursor[1])]
        }
        sql += " ORDER BY dist, id DESC LIMIT ?"
        args.append(.integer(Int64(limit + 1)))
        let rows = try c.query(sql, arguments: args)
        let hits = try rows.prefix(limit).map { r -> Hit in
            let id: String = try r.get("id"), d: Double = try r.get("dist")
            return Hit(id: id, distance: d, cursor: [String(d.bitPattern), id])
        }
        return (hits, rows.count > limit)
    }

    static func runSQL(_ c: Connection, _ q: Query, after cursor: [String]?, limit: Int, useIndexes: Bool) throws -> ([Hit], Bool) {
        var from = "market_tasks t"
        var conditions: [String] = []
        var args: [DatabaseValue] = []
        let marks = q.statuses.map { _ in "?" }.joined(separator: ",")
        conditions.append("t.status IN (\(marks))")
        args += q.statuses.map { .integer($0) }
        if q.near != nil { conditions.append("t.latitude IS NOT NULL") }

        var shortWords = q.words
        if useIndexes {
            let fts = MarketRules.ftsQuery(q.words)
            shortWords = q.words.filter { $0.unicodeScalars.count < 3 }
            if let fts {
                from = "market_task_text CROSS JOIN market_tasks t ON t.n = market_task_text.rowid"
                conditions.insert("market_task_text MATCH ?", at: 0)
                args.insert(.text(fts), at: 0)
            }
        }
        for w in shortWords {
            conditions.append("(instr(t.title_folded, ?) > 0 OR instr(t.description_folded, ?) > 0)")
            args += [.text(w), .text(w)]
        }
        let distance =
            q.near.map { Geo.sqlDistance(lat: "t.latitude", lon: "t.longitude", latParam: literal($0.latitude), lonParam: literal($0.longitude)) }
            ?? "NULL"
        var sql = "SELECT id, dist FROM (SELECT t.id AS id, \(distance) AS dist FROM \(from) WHERE \(conditions.joined(separator: " AND ")))"
        var outer: [String] = []
        if let r = q.radiusKm {
            outer.append("dist <= ?")
            args.append(.real(r))
        }
        if let cursor {
            if q.near != nil, let bits = UInt64(cursor[0]) {
                outer.append("(dist > ? OR (dist = ? AND id < ?))")
                let d = Double(bitPattern: bits)
                args += [.real(d), .real(d), .text(cursor[1])]
            } else {
                outer.append("id < ?")
                args.append(.text(cursor[1]))
            }
        }
        if !outer.isEmpty { sql += " WHERE " + outer.joined(separator: " AND ") }
        sql += q.near != nil ? " ORDER BY dist, id DESC" : " ORDER BY id DESC"
        sql += " LIMIT ?"
        args.append(.integer(Int64(limit + 1)))
        let rows = try c.query(sql, arguments: args)
        let hits = try rows.prefix(limit).map { r -> Hit in
            let id: String = try r.get("id")
            let d: Double? = try r.get("dist")
            return Hit(id: id, distance: d, cursor: [d.map { String($0.bitPattern) } ?? "", id])
        }
        return (hits, rows.count > limit)
    }
}
