// protoc-gen-swiftpbc: protoc plugin generating Swift value types, service protocols, client
// stubs and descriptor sets whose wire format is handled by protobuf-c (see docs/codegen.md).
//
// protoc writes a CodeGeneratorRequest to stdin and expects a CodeGeneratorResponse on stdout;
// both are decoded and encoded with protobuf-c's code for plugin.proto (in ContractsC).

import CProtobufC
import ContractsC

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func readStdin() -> [UInt8] {
    var data = [UInt8]()
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
        if n > 0 { data += buffer[0..<n] } else if n == 0 || errno != EINTR { break }
    }
    return data
}

func writeStdout(_ bytes: [UInt8]) {
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeBytes { write(1, $0.baseAddress! + offset, bytes.count - offset) }
        if n > 0 { offset += n } else if errno != EINTR { exit(1) }
    }
}

/// Builds and packs the CodeGeneratorResponse (files, or an error for protoc to print).
func respond(files: [(String, String)], error: String?) {
    var strings: [UnsafeMutablePointer<CChar>] = []
    func dup(_ s: String) -> UnsafeMutablePointer<CChar> {
        let p = strdup(s)!
        strings.append(p)
        return p
    }
    var response = Google__Protobuf__Compiler__CodeGeneratorResponse()
    google__protobuf__compiler__code_generator_response__init(&response)
    var entries = [Google__Protobuf__Compiler__CodeGeneratorResponse__File](repeating: .init(), count: files.count)
    for (i, (name, content)) in files.enumerated() {
        google__protobuf__compiler__code_generator_response__file__init(&entries[i])
        entries[i].name = dup(name)
        entries[i].content = dup(content)
    }
    if let error { response.error = dup(error) }
    let bytes: [UInt8] = entries.withUnsafeMutableBufferPointer { buf in
        var pointers: [UnsafeMutablePointer<Google__Protobuf__Compiler__CodeGeneratorResponse__File>?] =
            (0..<buf.count).map { buf.baseAddress! + $0 }
        return pointers.withUnsafeMutableBufferPointer { ptrs in
            response.n_file = ptrs.count
            response.file = ptrs.baseAddress
            let n = google__protobuf__compiler__code_generator_response__get_packed_size(&response)
            return [UInt8](unsafeUninitializedCapacity: max(n, 1)) { out, count in
                count = google__protobuf__compiler__code_generator_response__pack(&response, out.baseAddress!)
            }
        }
    }
    for s in strings { free(s) }
    writeStdout(bytes)
}

let input = readStdin()
guard
    let request = input.withUnsafeBufferPointer({
        google__protobuf__compiler__code_generator_request__unpack(nil, $0.count, $0.baseAddress)
    })
else {
    let message = Array("protoc-gen-swiftpbc: could not decode the CodeGeneratorRequest on stdin (run me from protoc)\n".utf8)
    _ = message.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(1)
}
do {
    let generator = try Generator(request: request)
    respond(files: try generator.generate(), error: nil)
} catch {
    respond(files: [], error: "protoc-gen-swiftpbc: \(error)")
}
google__protobuf__compiler__code_generator_request__free_unpacked(request, nil)
