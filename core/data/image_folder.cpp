#include "data/image_folder.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cstdio>
#include <jpeglib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/paths.h"

namespace ts {

namespace fs = std::filesystem;

namespace {

bool isImageName(const fs::path& p)
{
    std::string ext = p.extension().string();
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// libjpeg reports fatal errors through error_exit, which must not return: jump back to the
// decode call. decodeJpegRaw keeps no C++ objects with destructors alive across setjmp.
struct JpegError {
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    int warnings;
};

void jpegErrorExit(j_common_ptr cinfo)
{
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    std::longjmp(err->jump, 1);
}

void jpegEmitMessage(j_common_ptr cinfo, int level)
{
    auto* err = reinterpret_cast<JpegError*>(cinfo->err);
    if (level < 0) {  // a warning: corrupt data the decoder papered over
        if (err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->message);
    }
}

// Returns 0 on success, 1 on a fatal error, 2 for corrupt data (warnings); message in err.
// `alloc` sizes the output buffer once the dimensions are known and returns it.
int decodeJpegRaw(const uint8_t* data, std::size_t size, int channels, JpegError& err,
                  uint8_t* (*alloc)(void* ctx, int w, int h), void* ctx)
{
    jpeg_decompress_struct cinfo;
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpegErrorExit;
    err.mgr.emit_message = jpegEmitMessage;
    err.warnings = 0;
    err.message[0] = 0;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&cinfo);
    uint8_t* out = alloc(ctx, static_cast<int>(cinfo.output_width), static_cast<int>(cinfo.output_height));
    if (!out) {
        jpeg_destroy_decompress(&cinfo);
        std::snprintf(err.message, sizeof err.message, "out of memory for a %ux%u image", cinfo.output_width,
                      cinfo.output_height);
        return 1;
    }
    const std::size_t stride = static_cast<std::size_t>(cinfo.output_width) * static_cast<std::size_t>(channels);
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = out + static_cast<std::size_t>(cinfo.output_scanline) * stride;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return err.warnings > 0 ? 2 : 0;
}

// PNG through libpng's low-level API, as tf.io.decode_png reads it: the file's values, with no
// gamma or colour-profile conversion (the simplified png_image API converts 16-bit channels and
// files with a gAMA chunk to sRGB: a grey 25700 of 65535 came out 167, not 100), 16-bit channels
// cut to their high byte, alpha dropped rather than composited over black, palettes expanded.
// Grey from colour uses the ITU-R 601 weights, as the JPEG path (libjpeg) and PIL's "L" do.
// Errors longjmp back here; no C++ object with a destructor lives across the setjmp.
struct PngRead {
    const uint8_t* data;
    std::size_t size, pos;
    char message[256];
};

void pngReadData(png_structp png, png_bytep out, png_size_t n)
{
    auto* r = static_cast<PngRead*>(png_get_io_ptr(png));
    if (r->size - r->pos < n) png_error(png, "the file ends early (truncated)");
    std::memcpy(out, r->data + r->pos, n);
    r->pos += n;
}

void pngError(png_structp png, png_const_charp message)
{
    auto* r = static_cast<PngRead*>(png_get_error_ptr(png));
    std::snprintf(r->message, sizeof r->message, "%s", message);
    png_longjmp(png, 1);
}

void pngWarning(png_structp, png_const_charp) {}  // e.g. an sRGB profile libpng finds inexact: the pixels are fine

// Returns 0 on success, 1 on an error (message in r).
int decodePngRaw(const uint8_t* data, std::size_t size, int channels, PngRead& r, uint8_t* (*alloc)(void* ctx, int w, int h),
                 void* ctx)
{
    r.data = data;
    r.size = size;
    r.pos = 0;
    r.message[0] = 0;
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, pngError, pngWarning);
    if (!png) {
        std::snprintf(r.message, sizeof r.message, "out of memory");
        return 1;
    }
    png_infop info = png_create_info_struct(png);
    if (!info) {
        png_destroy_read_struct(&png, nullptr, nullptr);
        std::snprintf(r.message, sizeof r.message, "out of memory");
        return 1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        return 1;
    }
    png_set_read_fn(png, &r, pngReadData);
    png_read_info(png, info);
    const int colorType = png_get_color_type(png, info);
    const int bitDepth = png_get_bit_depth(png, info);
    if (colorType == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (colorType == PNG_COLOR_TYPE_GRAY && bitDepth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (bitDepth == 16) png_set_strip_16(png);
    png_set_strip_alpha(png);
    const bool color = (colorType & PNG_COLOR_MASK_COLOR) != 0;
    if (channels == 3 && !color) png_set_gray_to_rgb(png);
    if (channels == 1 && color) png_set_rgb_to_gray_fixed(png, PNG_ERROR_ACTION_NONE, 29900, 58700);
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    const std::size_t stride = static_cast<std::size_t>(w) * static_cast<std::size_t>(channels);
    if (png_get_rowbytes(png, info) != stride) {
        std::snprintf(r.message, sizeof r.message, "unexpected row layout (%zu bytes for %u pixels)", static_cast<std::size_t>(png_get_rowbytes(png, info)), w);
        png_destroy_read_struct(&png, &info, nullptr);
        return 1;
    }
    uint8_t* out = alloc(ctx, static_cast<int>(w), static_cast<int>(h));
    if (!out) {
        std::snprintf(r.message, sizeof r.message, "out of memory for a %ux%u image", w, h);
        png_destroy_read_struct(&png, &info, nullptr);
        return 1;
    }
    for (int pass = 0; pass < passes; ++pass)
        for (png_uint_32 y = 0; y < h; ++y) png_read_row(png, out + static_cast<std::size_t>(y) * stride, nullptr);
    png_destroy_read_struct(&png, &info, nullptr);
    return 0;
}

struct JpegAlloc {
    Tensor t;
    int channels = 3;
    bool failed = false;
};

uint8_t* allocJpeg(void* ctx, int w, int h)
{
    auto* a = static_cast<JpegAlloc*>(ctx);
    auto r = Tensor::create(Shape{h, w, a->channels}, DType::U8);
    if (!r.ok()) return nullptr;
    a->t = std::move(r).value();
    return a->t.data<uint8_t>();
}

Result<std::string> readWholeFile(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::error_code ec;
        if (!fs::exists(path, ec)) return makeError(ErrorCode::NotFound, "image file '" + path + "' does not exist", missingFileHint(path));
        return makeError(ErrorCode::IoError, "cannot open image file '" + path + "': " + std::strerror(errno));
    }
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return makeError(ErrorCode::IoError, "cannot read image file '" + path + "'");
    return bytes;
}

} // namespace

Result<ImageFolderListing> listImageFolder(const std::string& root, const std::vector<std::string>& classNames)
{
    std::error_code ec;
    if (!fs::is_directory(root, ec))
        return makeError(ErrorCode::NotFound, "image folder '" + root + "' does not exist or is not a folder",
                         "an image folder holds one sub-folder of images per class");
    ImageFolderListing out;
    out.root = root;
    if (classNames.empty()) {
        // As Keras' image_dataset_from_directory: hidden folders (.ipynb_checkpoints, .git) are
        // no classes (one would shift every label after it).
        for (const auto& entry : fs::directory_iterator(root, ec))
            if (entry.is_directory(ec) && entry.path().filename().string().rfind('.', 0) != 0)
                out.classNames.push_back(entry.path().filename().string());
        if (ec) return makeError(ErrorCode::IoError, "cannot list image folder '" + root + "': " + ec.message());
        std::sort(out.classNames.begin(), out.classNames.end());
        if (out.classNames.empty())
            return makeError(ErrorCode::NotFound, "image folder '" + root + "' has no class sub-folders",
                             "put the images of each class in a sub-folder named after it");
    } else {
        out.classNames = classNames;
        std::vector<std::string> sorted = classNames;
        std::sort(sorted.begin(), sorted.end());
        if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end())
            return makeError(ErrorCode::InvalidArgument, "image folder '" + root + "': class_names lists '" + *twice + "' twice",
                             "name each class once (its images would be read twice, with two labels)");
    }
    for (std::size_t c = 0; c < out.classNames.size(); ++c) {
        const fs::path dir = fs::path(root) / out.classNames[c];
        if (!fs::is_directory(dir, ec))
            return makeError(ErrorCode::NotFound, "image folder '" + root + "' has no class folder '" + out.classNames[c] + "'");
        // Images in sub-folders of a class folder are that class's too, as Keras walks them.
        std::vector<std::string> files;
        fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
        for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
            if (it->is_regular_file(ec) && isImageName(it->path())) files.push_back(it->path().string());
        if (ec) return makeError(ErrorCode::IoError, "cannot list '" + dir.string() + "': " + ec.message());
        // Keras' order: by folder, then by file name in it (keys made once, not per comparison).
        std::vector<std::pair<std::pair<std::string, std::string>, std::string>> keyed;
        keyed.reserve(files.size());
        for (auto& f : files) {
            const fs::path p(f);
            keyed.push_back({{p.parent_path().string(), p.filename().string()}, std::move(f)});
        }
        std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        for (std::size_t i = 0; i < keyed.size(); ++i) files[i] = std::move(keyed[i].second);
        for (auto& f : files)
            out.files.push_back({std::make_shared<const std::string>(std::move(f)), static_cast<int32_t>(c)});
    }
    if (out.files.empty())
        return makeError(ErrorCode::NotFound, "image folder '" + root + "' holds no .png, .jpg or .jpeg files in its class folders");
    return out;
}

Tensor resizeBilinear(const Tensor& image, int64_t height, int64_t width)
{
    const int64_t H = image.shape()[0], W = image.shape()[1];
    const int64_t C = image.shape().rank() == 3 ? image.shape()[2] : 1;
    if (H == height && W == width) return image;
    Tensor out = Tensor::empty(Shape{height, width, C}, DType::U8);
    const uint8_t* src = image.data<uint8_t>();
    uint8_t* dst = out.data<uint8_t>();
    const double sy = static_cast<double>(H) / static_cast<double>(height);
    const double sx = static_cast<double>(W) / static_cast<double>(width);
    std::vector<int64_t> x0(static_cast<std::size_t>(width)), x1(static_cast<std::size_t>(width));
    std::vector<float> fx(static_cast<std::size_t>(width));
    for (int64_t j = 0; j < width; ++j) {
        const double x = std::clamp((static_cast<double>(j) + 0.5) * sx - 0.5, 0.0, static_cast<double>(W - 1));
        x0[static_cast<std::size_t>(j)] = static_cast<int64_t>(x);
        x1[static_cast<std::size_t>(j)] = std::min<int64_t>(x0[static_cast<std::size_t>(j)] + 1, W - 1);
        fx[static_cast<std::size_t>(j)] = static_cast<float>(x - static_cast<double>(x0[static_cast<std::size_t>(j)]));
    }
    for (int64_t i = 0; i < height; ++i) {
        const double y = std::clamp((static_cast<double>(i) + 0.5) * sy - 0.5, 0.0, static_cast<double>(H - 1));
        const int64_t y0 = static_cast<int64_t>(y), y1 = std::min<int64_t>(y0 + 1, H - 1);
        const float fy = static_cast<float>(y - static_cast<double>(y0));
        const uint8_t* r0 = src + y0 * W * C;
        const uint8_t* r1 = src + y1 * W * C;
        uint8_t* d = dst + i * width * C;
        for (int64_t j = 0; j < width; ++j) {
            const std::size_t js = static_cast<std::size_t>(j);
            const float a = fx[js];
            for (int64_t c = 0; c < C; ++c) {
                const float top = r0[x0[js] * C + c] * (1.f - a) + r0[x1[js] * C + c] * a;
                const float bot = r1[x0[js] * C + c] * (1.f - a) + r1[x1[js] * C + c] * a;
                d[j * C + c] = static_cast<uint8_t>(std::lround(std::clamp(top * (1.f - fy) + bot * fy, 0.f, 255.f)));
            }
        }
    }
    return out;
}

Result<Tensor> decodeImage(const uint8_t* data, std::size_t size, const std::string& name, int64_t height,
                           int64_t width, int channels)
{
    if (channels != 1 && channels != 3)
        return makeError(ErrorCode::InvalidArgument, "decode '" + name + "': channels must be 1 or 3, got " + std::to_string(channels));
    static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    Tensor img;
    if (size >= 8 && std::memcmp(data, kPng, 8) == 0) {
        PngRead r;
        JpegAlloc alloc;
        alloc.channels = channels;
        if (decodePngRaw(data, size, channels, r, allocJpeg, &alloc) != 0) {
            if (std::strncmp(r.message, "out of memory", 13) == 0)
                return makeError(ErrorCode::InvalidArgument, "cannot decode PNG image '" + name + "': " + r.message,
                                 "the file says it is that large: make it smaller, or leave it out of the data");
            return makeError(ErrorCode::ParseError, "cannot decode PNG image '" + name + "': " + r.message, "the file is corrupt or truncated");
        }
        img = std::move(alloc.t);
    } else if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
        JpegError err;
        JpegAlloc alloc;
        alloc.channels = channels;
        const int rc = decodeJpegRaw(data, size, channels, err, allocJpeg, &alloc);
        if (rc != 0)
            return makeError(ErrorCode::ParseError,
                             std::string("cannot decode JPEG image '") + name + "': " +
                                 (rc == 2 ? "corrupt data (" : "") + err.message + (rc == 2 ? ")" : ""),
                             "the file is corrupt or truncated");
        img = std::move(alloc.t);
    } else {
        char buf[64] = {};
        std::string head;
        for (std::size_t i = 0; i < std::min<std::size_t>(size, 8); ++i) {
            std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", data[i]);
            head += buf;
        }
        return makeError(ErrorCode::ParseError,
                         "'" + name + "' is neither a PNG nor a JPEG image (it starts with bytes " +
                             (head.empty() ? std::string("(none: the file is empty)") : head) + ")",
                         "image folders may hold only .png and .jpg files");
    }
    if (height > 0 && width > 0) img = resizeBilinear(img, height, width);
    return img;
}

Result<Tensor> decodeImageFile(const std::string& path, int64_t height, int64_t width, int channels)
{
    TS_ASSIGN(std::string bytes, readWholeFile(path));
    return decodeImage(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path, height, width, channels);
}

Status writePng(const std::string& path, const Tensor& image)
{
    const int rank = image.shape().rank();
    const int64_t c = rank == 3 ? image.shape()[2] : 1;
    if (image.dtype() != DType::U8 || (rank != 2 && rank != 3) || (c != 1 && c != 3))
        return makeError(ErrorCode::InvalidArgument, "writePng '" + path + "': expected a u8 (H, W[, 1 or 3]) image, got " +
                                                         std::string(dtypeName(image.dtype())) + " " + image.shape().toString());
    png_image pi;
    std::memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    pi.width = static_cast<png_uint_32>(image.shape()[1]);
    pi.height = static_cast<png_uint_32>(image.shape()[0]);
    pi.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    if (!png_image_write_to_file(&pi, path.c_str(), 0, image.raw(), 0, nullptr))
        return makeError(ErrorCode::IoError, "cannot write PNG '" + path + "': " + pi.message);
    return okStatus();
}

Status writeJpeg(const std::string& path, const Tensor& image, int quality)
{
    const int rank = image.shape().rank();
    const int64_t c = rank == 3 ? image.shape()[2] : 1;
    if (image.dtype() != DType::U8 || (rank != 2 && rank != 3) || (c != 1 && c != 3))
        return makeError(ErrorCode::InvalidArgument, "writeJpeg '" + path + "': expected a u8 (H, W[, 1 or 3]) image");
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return makeError(ErrorCode::IoError, "cannot create '" + path + "': " + std::strerror(errno));
    jpeg_compress_struct cinfo;
    jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);  // compressing our own buffer cannot hit data errors
    jpeg_create_compress(&cinfo);
    jpeg_stdio_dest(&cinfo, f);
    cinfo.image_width = static_cast<JDIMENSION>(image.shape()[1]);
    cinfo.image_height = static_cast<JDIMENSION>(image.shape()[0]);
    cinfo.input_components = static_cast<int>(c);
    cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    jpeg_start_compress(&cinfo, TRUE);
    const std::size_t stride = static_cast<std::size_t>(image.shape()[1] * c);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = const_cast<JSAMPROW>(image.data<uint8_t>() + cinfo.next_scanline * stride);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    if (std::fclose(f) != 0) return makeError(ErrorCode::IoError, "cannot write '" + path + "'");
    return okStatus();
}

} // namespace ts
