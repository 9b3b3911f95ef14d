export PYTHONUNBUFFERED=1
hdr() { echo "=== $* ($(date -u +%H:%M:%S))"; }
t_zero() { hdr t_zero; timeout 330 python -m pytest -q -m gpu tests/test_linear_kernel.py -k "mxfp4_scale_fold"; }
b_lin_bf16() { hdr b_lin_bf16; timeout 480 python -m nvfp4_gemv.cli bench --linear --out $OUT/bf16; }
b_lin_fp16() { hdr b_lin_fp16; timeout 480 python -m nvfp4_gemv.cli bench --linear --x-dtype fp16 --out $OUT/fp16; }
b_gemv() { hdr b_gemv; timeout 300 python -m nvfp4_gemv.cli bench --suite decode --no-baselines --iters 30 --out $OUT/gemv; }
b_ab() { hdr b_ab $1; timeout 300 python -m nvfp4_gemv.cli ab $1 --out $OUT/ab_$1; }
t_rand() { hdr t_rand $1 $2; NVFP4_GEMV_DRAW_SEED=$1 NVFP4_GEMV_DRAWS=$2 timeout 400 python -m pytest -q -m gpu tests/test_random_shapes_gpu.py; }
t_user() { hdr t_user; timeout 400 python -m pytest -q -m gpu tests/test_linear_loaders.py tests/test_linear_op.py tests/test_public_api.py; }
t_nan() { hdr t_nan; timeout 500 python -m pytest -q -m gpu tests/test_linear_kernel.py -k "nan_scales or every_scale_byte" 2>&1 | tail -25; }
t_cols() { hdr t_cols; timeout 400 python -m pytest -q -m gpu tests/test_linear_kernel.py -k "nan_scales or every_scale_byte or block_columns or columns" 2>&1 | tail -8; }
