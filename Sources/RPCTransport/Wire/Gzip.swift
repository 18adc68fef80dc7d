import CZlib

/// gzip for `grpc-encoding: gzip`, through zlib.
public enum Gzip {
    public struct TooLarge: Error {}
    public struct Corrupt: Error {}

    public static func compress(_ input: [UInt8]) -> [UInt8] {
        var stream = z_stream()
        // windowBits 15 + 16 selects the gzip wrapper.
        guard
            deflateInit2_(
                &stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY,
                ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK
        else { return input }
        defer { deflateEnd(&stream) }
        let bound = Int(deflateBound(&stream, uLong(input.count))) + 32
        var out = [UInt8](repeating: 0, count: bound)
        var input = input
        let produced: Int = input.withUnsafeMutableBufferPointer { inp in
            out.withUnsafeMutableBufferPointer { o in
                stream.next_in = inp.baseAddress
                stream.avail_in = uInt(inp.count)
                stream.next_out = o.baseAddress
                stream.avail_out = uInt(o.count)
                _ = deflate(&stream, Z_FINISH)
                return o.count - Int(stream.avail_out)
            }
        }
        out.removeSubrange(produced...)
        return out
    }

    /// Inflates at most `limit` bytes; more is `TooLarge` (a zip bomb never gets allocated).
    public static func decompress(_ input: [UInt8], limit: Int) throws -> [UInt8] {
        var stream = z_stream()
        guard inflateInit2_(&stream, 15 + 32, ZLIB_VERSION, Int32(MemoryLayout<z_stream>.size)) == Z_OK else { throw Corrupt() }
        defer { inflateEnd(&stream) }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: min(max(input.count * 4, 4096), 1 << 20))
        var input = input
        var status: Int32 = Z_OK
        try input.withUnsafeMutableBufferPointer { inp in
            stream.next_in = inp.baseAddress
            stream.avail_in = uInt(inp.count)
            repeat {
                let n: Int = chunk.withUnsafeMutableBufferPointer { c in
                    stream.next_out = c.baseAddress
                    stream.avail_out = uInt(c.count)
                    status = inflate(&stream, Z_NO_FLUSH)
                    return c.count - Int(stream.avail_out)
                }
                if status != Z_OK && status != Z_STREAM_END && !(status == Z_BUF_ERROR && n > 0) { throw Corrupt() }
                if out.count + n > limit { throw TooLarge() }
                out.append(contentsOf: chunk[0..<n])
                if status == Z_BUF_ERROR && stream.avail_in == 0 { throw Corrupt() }
            } while status != Z_STREAM_END
        }
        return out
    }
}
