#pragma once
// Image folders (Keras' image_dataset_from_directory layout): root/<class name>/<image files>,
// one sub-folder per class, labels numbered by the sorted class names. PNG and JPEG are decoded
// with libpng and libjpeg-turbo (Debian's libpng-dev, libjpeg62-turbo-dev), detected by content,
// and resized bilinearly to a fixed size.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

struct ImageFolderListing {
    std::string root;
    std::vector<std::string> classNames;
    struct File {
        std::shared_ptr<const std::string> path;
        int32_t label = 0;
    };
    std::vector<File> files;  // by class, then by path
};

// Lists root's class sub-folders (hidden ones skipped; or exactly `classNames`, in that order,
// each once) and the .png, .jpg and .jpeg files (any case) anywhere under each, as Keras'
// image_dataset_from_directory. NotFound: no root, a named class folder missing, or no images.
Result<ImageFolderListing> listImageFolder(const std::string& root, const std::vector<std::string>& classNames = {});

// Decodes an encoded PNG or JPEG held in memory to u8 (height, width, channels), channels 1
// (grey) or 3 (RGB); alpha is composited onto black, grey is replicated, colour becomes grey by the
// decoder's own conversion. height/width 0 keep the image's own size. `name` appears in errors.
// Truncated or corrupt data is an error (like tf.io.decode_jpeg), not a partly grey image.
Result<Tensor> decodeImage(const uint8_t* data, std::size_t size, const std::string& name, int64_t height,
                           int64_t width, int channels);
Result<Tensor> decodeImageFile(const std::string& path, int64_t height, int64_t width, int channels);

// Bilinear resize (half-pixel centres, like tf.image.resize) of u8 (H, W, C) to (height, width, C).
Tensor resizeBilinear(const Tensor& image, int64_t height, int64_t width);

// Writers for test fixtures and tools: u8 (H, W) or (H, W, C) with C 1 or 3.
Status writePng(const std::string& path, const Tensor& image);
Status writeJpeg(const std::string& path, const Tensor& image, int quality = 90);

} // namespace ts
