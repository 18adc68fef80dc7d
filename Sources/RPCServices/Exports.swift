@_exported import struct RPCProtobuf.ProtoDescriptorSet
