import Contracts
import Foundation
import ServiceKit
import Storage

/// Places on Earth as the marketplace and habit events use them: validation, the exact
/// great-circle distance, and the bounding box an R*Tree is asked for (split at the antimeridian,
/// opened to every longitude when a pole is inside the circle). Pure functions, unit-tested.
public struct GeoPoint: Sendable, Equatable {
    public var latitude: Double
    public var longitude: Double
    public init(latitude: Double, longitude: Double) {
        self.latitude = latitude
        self.longitude = longitude
    }
}

public enum Geo {
    /// Mean Earth radius (IUGG), km.
    public static let earthRadiusKm = 6371.0088

    /// The point of a request, or the problem named at `field` (latitude -90..90, longitude
    /// -180..180, finite).
    static func point(_ p: Common_V1_GeoPoint, field: String, into errors: inout FieldErrors) -> GeoPoint? {
        var ok = true
        if !p.latitude.isFinite || !(-90...90).contains(p.latitude) {
            errors.add("\(field).latitude", "must be between -90 and 90")
            ok = false
        }
        if !p.longitude.isFinite || !(-180...180).contains(p.longitude) {
            errors.add("\(field).longitude", "must be between -180 and 180")
            ok = false
        }
        return ok ? GeoPoint(latitude: p.latitude, longitude: p.longitude) : nil
    }

    static func proto(_ p: GeoPoint) -> Common_V1_GeoPoint {
        var m = Common_V1_GeoPoint()
        m.latitude = p.latitude
        m.longitude = p.longitude
        return m
    }

    /// Great-circle distance in km (haversine: accurate for small distances, clamped for
    /// antipodes). The SQL in `sqlDistance` computes the same formula.
    public static func distanceKm(_ a: GeoPoint, _ b: GeoPoint) -> Double {
        let rad = Double.pi / 180
        let dLat = (b.latitude - a.latitude) * rad, dLon = (b.longitude - a.longitude) * rad
        let h = pow(sin(dLat / 2), 2) + cos(a.latitude * rad) * cos(b.latitude * rad) * pow(sin(dLon / 2), 2)
        return 2 * earthRadiusKm * asin(min(1, sqrt(h)))
    }

    /// The haversine of `distanceKm` as an SQL expression over the columns `lat` and `lon`, with
    /// the centre's latitude and longitude bound as `?1`-style parameters `latParam`, `lonParam`
    /// (SQLite's math functions).
    static func sqlDistance(lat: String, lon: String, latParam: String, lonParam: String) -> String {
        "(2 * \(earthRadiusKm) * asin(min(1, sqrt(pow(sin(radians(\(lat) - \(latParam)) / 2), 2) + cos(radians(\(latParam))) * cos(radians(\(lat))) * pow(sin(radians(\(lon) - \(lonParam)) / 2), 2)))))"
    }

    /// A box of latitudes and one or two ranges of longitudes that contains every point within
    /// `radiusKm` of `center` (slightly larger: the exact distance decides).
    public struct Box: Sendable, Equatable {
        public var minLatitude: Double
        public var maxLatitude: Double
        /// One range, or two when the circle crosses the antimeridian; all longitudes when it
        /// contains a pole.
        public var longitudes: [ClosedRange<Double>]

        /// Whether the box contains `p` (what the R*Tree answers, for the tests).
        public func contains(_ p: GeoPoint) -> Bool {
            (minLatitude...maxLatitude).contains(p.latitude) && longitudes.contains { $0.contains(p.longitude) }
        }
    }

    /// Padding in degrees (about 11 m): the R*Tree keeps 32-bit floats (rounded outwards).
    static let padding = 1e-4

    public static func boundingBox(center c: GeoPoint, radiusKm r: Double) -> Box {
        let angular = r / earthRadiusKm  // radians
        let everywhere = Box(minLatitude: -90, maxLatitude: 90, longitudes: [-180...180])
        guard angular < .pi else { return everywhere }
        let dLat = angular * 180 / .pi
        let minLat = c.latitude - dLat - padding, maxLat = c.latitude + dLat + padding
        // A pole within the circle: every longitude, latitudes to the pole.
        if maxLat >= 90 || minLat <= -90 {
            return Box(minLatitude: max(-90, minLat), maxLatitude: min(90, maxLat), longitudes: [-180...180])
        }
        // The widest longitude span of the circle (at the latitude of the tangent points).
        let s = sin(angular) / cos(c.latitude * .pi / 180)
        guard s < 1 else { return Box(minLatitude: minLat, maxLatitude: maxLat, longitudes: [-180...180]) }
        let dLon = asin(s) * 180 / .pi + padding
        let lo = c.longitude - dLon, hi = c.longitude + dLon
        var ranges: [ClosedRange<Double>]
        if dLon >= 180 {
            ranges = [-180...180]
        } else if lo < -180 {
            ranges = [(lo + 360)...180, -180...hi]
        } else if hi > 180 {
            ranges = [lo...180, -180...(hi - 360)]
        } else {
            ranges = [lo...hi]
        }
        return Box(minLatitude: minLat, maxLatitude: maxLat, longitudes: ranges)
    }

    /// The R*Tree condition of `box` on the table alias `g` (columns min_lat, max_lat, min_lon,
    /// max_lon) and its arguments.
    static func rtreeCondition(_ box: Box, alias g: String) -> (sql: String, args: [DatabaseValue]) {
        var sql = "\(g).max_lat >= ? AND \(g).min_lat <= ?"
        var args: [DatabaseValue] = [.real(box.minLatitude), .real(box.maxLatitude)]
        let lon = box.longitudes.map { _ in "(\(g).max_lon >= ? AND \(g).min_lon <= ?)" }.joined(separator: " OR ")
        sql += " AND (\(lon))"
        for r in box.longitudes { args += [.real(r.lowerBound), .real(r.upperBound)] }
        return (sql, args)
    }
}

/// Image types by their first bytes (never by what a client says).
enum ImageBytes {
    /// "image/jpeg", "image/png" or "image/webp"; nil for anything else.
    static func contentType(_ b: [UInt8]) -> String? {
        if b.count >= 3, b[0] == 0xFF, b[1] == 0xD8, b[2] == 0xFF { return "image/jpeg" }
        if b.count >= 8, b[0..<8].elementsEqual([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]) { return "image/png" }
        if b.count >= 12, b[0..<4].elementsEqual(Array("RIFF".utf8)), b[8..<12].elementsEqual(Array("WEBP".utf8)) { return "image/webp" }
        return nil
    }
}

/// IANA zone names of requests ("today" for habits).
enum RequestZone {
    /// The zone, or the problem named at `field`.
    static func zone(_ name: String, field: String = "time_zone", into errors: inout FieldErrors) -> TimeZone {
        let trimmed = FieldRules.trimmed(name)
        guard let z = ChoreZone.zone(named: trimmed) else {
            errors.add(field, "is not a known IANA time zone (e.g. \"Europe/Berlin\")")
            return TimeZone(identifier: "UTC")!
        }
        return z
    }
}
